"""The tokenizer's side files in a model folder: tokenizer_config.json, special_tokens_map.json
and the chat templates, read as transformers 5's `AutoTokenizer` reads them.

A chat template may be in chat_template.jinja (with named extras such as
additional_chat_templates/tool_use.jinja), or in tokenizer_config.json's `chat_template`: a
string, a list of named templates (`[{"name": "default", "template": ...}, ...]`) or a map
of them. Each template keeps the name of the place it came from, so that an error in one
names that file (or entry) and not another.

The added tokens (`<|im_end|>`, `<think>`) are tokenizer.json's, completed as transformers
completes them from tokenizer_config.json: its `added_tokens_decoder` and the special tokens
it names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as _HFTokenizer

from engine.errors import TokenizerError
from engine.json_limits import read_json_file
from engine.template_sandbox import TemplateLimits

TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"  # older saves; read where transformers reads it
TEMPLATE_FILE = "chat_template.jinja"
EXTRA_TEMPLATES = "additional_chat_templates"  # transformers 5 saves named templates here
MAX_TOKENIZER_CONFIG_BYTES = 16 << 20  # Qwen3.5's is 16 KB, template included
# The named templates a request picks from: `tool_use` for one with tools, where the model
# names one, else `default` (transformers' `get_chat_template`).
DEFAULT, TOOL_USE = "default", "tool_use"


@dataclass(frozen=True)
class ChatTemplates:
    """The model's default and `tool_use` templates, each with where it came from; `names`
    and `where`: every named template found and the place that holds them (for the error
    that says a model has no default)."""

    default: str | None = None
    default_source: str | None = None
    tool_use: str | None = None
    tool_use_source: str | None = None
    names: tuple[str, ...] = ()
    where: str | None = None


def read_tokenizer_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = read_json_file(path, TokenizerError, MAX_TOKENIZER_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: the top level must be a JSON object")
    return data


def read_template(path: Path) -> str:
    limit = 4 * TemplateLimits.max_template_chars  # bytes: up to 4 per character
    try:
        if path.stat().st_size > limit:
            raise TokenizerError(
                f"{path}: is {path.stat().st_size:,} bytes, over the {limit:,} a chat "
                "template ever needs (Qwen3.5's is 8 KB); replace the file"
            )
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot be read ({exc})") from exc


def find_templates(folder: Path, tok_config: Mapping[str, Any]) -> ChatTemplates:
    """As transformers 5 loads them: the files chat_template.jinja and
    additional_chat_templates/tool_use.jinja when either exists, else tokenizer_config.json's
    `chat_template`, a string, a list of named templates or a map of them."""
    path, extra = folder / TEMPLATE_FILE, folder / EXTRA_TEMPLATES / f"{TOOL_USE}.jinja"
    if path.is_file() or extra.is_file():
        default = read_template(path) if path.is_file() else None
        tool = read_template(extra) if extra.is_file() else None
        return ChatTemplates(
            default=default,
            default_source=str(path) if default is not None else None,
            tool_use=tool,
            tool_use_source=str(extra) if tool is not None else None,
            names=tuple(n for n, t in ((DEFAULT, default), (TOOL_USE, tool)) if t is not None),
            where=str(folder),
        )
    raw = tok_config.get("chat_template")
    where = f"{folder / TOKENIZER_CONFIG} [chat_template]"
    if isinstance(raw, str):
        return ChatTemplates(default=raw, default_source=where, names=(DEFAULT,), where=where)
    if isinstance(raw, list):  # [{"name": "default", "template": ...}, ...]
        raw = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
    if not isinstance(raw, Mapping):
        return ChatTemplates()
    named = {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
    default, tool = named.get(DEFAULT), named.get(TOOL_USE)
    return ChatTemplates(
        default=default,
        default_source=f"{where[:-1]} {DEFAULT!r}]" if default is not None else None,
        tool_use=tool,
        tool_use_source=f"{where[:-1]} {TOOL_USE!r}]" if tool is not None else None,
        names=tuple(named),
        where=where,
    )


def template_tokens(folder: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The special tokens transformers 5 passes to a chat template: the named ones
    (bos_token ... mask_token), any other `*_token` entry of tokenizer_config.json and the
    `model_specific_special_tokens` / `extra_special_tokens` maps (image_token, ...).

    A tokenizer_config.json without `added_tokens_decoder` (as transformers 5 saves it) is
    completed by special_tokens_map.json where the folder has one, whose entries win (a
    null entry removes the token), as transformers loads such a folder."""
    merged = dict(config)
    if "added_tokens_decoder" not in config and (folder / SPECIAL_TOKENS_MAP).is_file():
        path = folder / SPECIAL_TOKENS_MAP
        extra = read_json_file(path, TokenizerError, MAX_TOKENIZER_CONFIG_BYTES)
        if not isinstance(extra, dict):
            raise TokenizerError(f"{path}: the top level must be a JSON object")
        merged.update(extra)
    out: dict[str, str] = {}
    for key, value in merged.items():
        if isinstance(key, str) and key.endswith("_token"):
            if (text := token_text(value)) is not None:
                out[key] = text
    for group in ("extra_special_tokens", "model_specific_special_tokens"):
        named = merged.get(group)
        if isinstance(named, Mapping):
            for key, value in named.items():
                if isinstance(key, str) and (text := token_text(value)) is not None:
                    out[key] = text
    return out


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


# An added token's flags as tokenizer.json and tokenizer_config.json write them, with the
# values `tokenizers.AddedToken` takes when one is left out (`normalized`: not `special`).
TOKEN_FLAGS = {"single_word": False, "lstrip": False, "rstrip": False}


def declared_added_tokens(path: Path, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """tokenizer_config.json's `added_tokens_decoder` as tokenizer.json's `added_tokens`
    entries (id, content, flags), in id order; [] where the file has none.

    transformers builds a tokenizer's added vocabulary from this map where it is present,
    so a token a fine-tune lists only here is one token there, not its pieces."""
    raw = config.get("added_tokens_decoder")
    if raw is None:
        return []
    where = f"{path} [added_tokens_decoder]"
    if not isinstance(raw, Mapping):
        raise TokenizerError(f"{where}: must be an object of token id -> token; fix the file")
    out = []
    for key, entry in raw.items():
        try:
            token_id = int(key)
        except (TypeError, ValueError):
            token_id = -1
        if token_id < 0 or not isinstance(entry, Mapping):
            raise TokenizerError(
                f"{where[:-1]} {key!r}]: must be a token id with an object for the token; "
                "fix the file"
            )
        if not isinstance(entry.get("content"), str) or not entry["content"]:
            raise TokenizerError(f"{where[:-1]} {key!r}]: has no `content` text; fix the file")
        flags = {name: bool(entry.get(name, default)) for name, default in TOKEN_FLAGS.items()}
        special = bool(entry.get("special", False))
        normalized = bool(entry.get("normalized", not special))
        out.append(
            {"id": token_id, "content": entry["content"], **flags}
            | {"normalized": normalized, "special": special}
        )
    return sorted(out, key=lambda entry: entry["id"])


def special_token_texts(folder: Path, config: Mapping[str, Any]) -> list[str]:
    """Every special token tokenizer_config.json names (bos_token ..., image_token, the
    `extra_special_tokens` and `additional_special_tokens` lists), which transformers adds
    to the tokenizer as special tokens where tokenizer.json lacks them."""
    texts = list(template_tokens(folder, config).values())
    for group in ("extra_special_tokens", "additional_special_tokens"):
        listed = config.get(group)
        if isinstance(listed, list):
            texts += [text for value in listed if (text := token_text(value)) is not None]
    return list(dict.fromkeys(texts))


def with_config_tokens(tok: _HFTokenizer, path: Path, config: dict[str, Any]) -> _HFTokenizer:
    """`tok` with the added tokens transformers' AutoTokenizer gives the folder: those of
    tokenizer_config.json's `added_tokens_decoder` (with its flags, ids in its order), then
    each special token the config names that is not yet one.

    Where the map lacks a token tokenizer.json adds, that token is kept (transformers drops
    it for Qwen's tokenizer class; llama.cpp and every reader of tokenizer.json keep it)."""
    folder = path.parent
    declared = declared_added_tokens(folder / TOKENIZER_CONFIG, config)
    present = {t.content: t for t in tok.get_added_tokens_decoder().values()}
    if any(_differs(present.get(entry["content"]), entry) for entry in declared):
        tok = _rebuilt(path, declared)
    have = {t.content for t in tok.get_added_tokens_decoder().values()}
    named = [text for text in special_token_texts(folder, config) if text not in have]
    if named:
        tok.add_tokens([AddedToken(text, special=True) for text in named])
    return tok


def _differs(token: AddedToken | None, entry: dict[str, Any]) -> bool:
    names = (*TOKEN_FLAGS, "normalized", "special")
    return token is None or any(getattr(token, name) != entry[name] for name in names)


def _rebuilt(path: Path, declared: list[dict[str, Any]]) -> _HFTokenizer:
    """tokenizer.json read again with its added tokens replaced by `declared` where both
    name one, all in id order (`tokenizers` numbers added tokens in the order listed)."""
    try:
        data = json.loads(path.read_bytes())  # `tokenizers` has just read it whole
        listed = {entry["content"]: entry for entry in data.get("added_tokens") or []}
        listed.update({entry["content"]: entry for entry in declared})
        data["added_tokens"] = sorted(listed.values(), key=lambda entry: int(entry["id"]))
        return _HFTokenizer.from_str(json.dumps(data))
    except Exception as exc:  # the Rust library raises a bare Exception on bad input
        raise TokenizerError(
            f"{path}: cannot take the added tokens tokenizer_config.json lists ({exc})"
        ) from exc
