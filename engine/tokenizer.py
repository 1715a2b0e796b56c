"""Tokenizer, chat template and streaming detokenizer for a model folder.

`tokenizer.json` is read with the `tokenizers` library. The chat template is Jinja text
downloaded with the model, so it renders in an immutable sandbox that refuses access to
Python internals (`''.__class__`, `cycler.__init__.__globals__`) instead of silently
rendering them as empty strings, and within time and size budgets
(engine.template_sandbox) so that a hostile template cannot hang or exhaust the machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import SecurityError
from tokenizers import Tokenizer as _HFTokenizer

from engine.errors import TemplateError, TemplateLimitError, TokenizerError
from engine.json_limits import read_json_file
from engine.template_sandbox import BoundedSandbox, LimitHit, TemplateLimits

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
REPLACEMENT = "\ufffd"
MAX_TOKENIZER_CONFIG_BYTES = 16 << 20  # Qwen3.5's is 16 KB, template included


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template. Build with `load`."""

    # Budgets of one chat-template compile or render; set before the first render to change.
    template_limits = TemplateLimits()

    def __init__(
        self,
        tok: _HFTokenizer,
        *,
        source: Path,
        template: str | None = None,
        template_source: str | None = None,
        special: Mapping[str, str] | None = None,
        eos_ids: Sequence[int] = (),
    ) -> None:
        self._tok = tok
        self.source = source
        self.template = template
        self.template_source = template_source
        self._special = dict(special or {})  # bos_token, eos_token, pad_token for templates
        self._compiled: jinja2.Template | None = None
        self._env: BoundedSandbox | None = None
        self.vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        self.eos_ids = self._collect_eos(eos_ids)

    @classmethod
    def load(
        cls, model_dir: str | os.PathLike[str], eos_token_ids: Iterable[int] = ()
    ) -> Tokenizer:
        """Read tokenizer.json, tokenizer_config.json and the chat template from `model_dir`.

        `eos_token_ids` are the config's stop ids (`ModelConfig.eos_token_ids`); the
        tokenizer's own eos token and `<|im_end|>` / `<|endoftext|>` are added to them.
        """
        folder = Path(model_dir)
        path = folder / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerError(
                f"{path}: tokenizer.json not found; the model folder needs the tokenizer "
                "files that come with the weights"
            )
        try:
            tok = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception on bad input
            raise TokenizerError(f"{path}: cannot be loaded by `tokenizers` ({exc})") from exc
        tok_config = _read_tokenizer_config(folder / TOKENIZER_CONFIG)
        template, template_source = _find_template(folder, tok_config)
        special = {
            key: text
            for key in ("bos_token", "eos_token", "pad_token")
            if (text := _token_text(tok_config.get(key))) is not None
        }
        return cls(
            tok,
            source=path,
            template=template,
            template_source=template_source,
            special=special,
            eos_ids=tuple(eos_token_ids),
        )

    def _collect_eos(self, config_ids: Sequence[int]) -> tuple[int, ...]:
        named = [self._special.get("eos_token"), *STOP_TOKENS]
        found = [self._tok.token_to_id(name) for name in named if name]
        ids = [int(i) for i in config_ids] + [i for i in found if i is not None]
        return tuple(dict.fromkeys(ids))  # union, first occurrence order

    # -- text <-> ids --------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it (`<|im_start|>`) match whole."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    # -- chat ----------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return self.template is not None

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render `messages` ([{"role", "content"}, ...]) with the model's chat template.

        `enable_thinking` is passed to the template only when given, so the template's own
        default (thinking on for Qwen3.5 4B/9B, off for 0.8B/2B) applies otherwise. `tools`
        (OpenAI function specs, `{"type": "function", "function": {...}}`) likewise.
        """
        template = self._get_template()
        variables: dict[str, Any] = {
            **self._special,
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
        }
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        if tools is not None:
            variables["tools"] = tools
        return self._render(template, variables)

    def _render(self, template: jinja2.Template, variables: dict[str, Any]) -> str:
        assert self._env is not None
        try:
            return self._env.render_bounded(template, variables)
        except TemplateError:
            raise
        except SecurityError as exc:
            raise TemplateError(
                f"{self.template_source}: the chat template tried to reach outside its sandbox "
                f"({exc}); the template is unsafe, replace it or use raw prompts"
            ) from exc
        except (LimitHit, RecursionError, MemoryError) as exc:
            raise self._limit_error(exc, "rendering") from None
        except Exception as exc:  # any Jinja or Python error inside the template
            raise TemplateError(
                f"{self.template_source}: rendering the chat template failed "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc

    def _limit_error(self, exc: BaseException, stage: str) -> TemplateLimitError:
        if isinstance(exc, RecursionError):
            what = "nests too deeply (Python's recursion limit)"
        elif isinstance(exc, MemoryError):
            what = "ran out of memory"
        else:
            what = str(exc)
        return TemplateLimitError(
            f"{self.template_source or TEMPLATE_FILE}: {stage} the chat template was stopped: "
            f"it {what}; a real chat template stays far inside these limits, so replace the "
            "template or use raw prompts"
        )

    def chat_ids(
        self,
        messages: list[dict[str, Any]],
        enable_thinking: bool | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of the rendered chat, ending in the assistant generation prompt."""
        return self.encode(self.apply_chat_template(messages, True, enable_thinking, tools))

    def _get_template(self) -> jinja2.Template:
        if self._compiled is not None:
            return self._compiled
        if self.template is None:
            raise TokenizerError(
                f"{self.source.parent}: no chat template (neither {TEMPLATE_FILE} nor "
                f"`chat_template` in {TOKENIZER_CONFIG}); use raw prompts for this model"
            )
        source = self.template_source or TEMPLATE_FILE

        def raise_exception(message: str) -> None:
            raise TemplateError(f"{source}: the chat template refused the messages: {message}")

        env = _SandboxEnvironment(
            self.template_limits,
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, "jinja2.ext.loopcontrols"],
        )
        env.filters["tojson"] = env.guard_filter(_tojson, "tojson")
        env.globals["raise_exception"] = raise_exception
        try:
            self._compiled = env.compile_bounded(self.template)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"{source}: line {exc.lineno}: the chat template is not valid Jinja ({exc.message})"
            ) from exc
        except (LimitHit, RecursionError, MemoryError) as exc:
            raise self._limit_error(exc, "compiling") from None
        except Exception as exc:  # Python's compiler refusing the generated code, and the like
            raise TemplateError(
                f"{source}: the chat template cannot be compiled ({type(exc).__name__}: "
                f"{str(exc)[:200]})"
            ) from exc
        self._env = env
        return self._compiled


class StreamDecoder:
    """Incremental detokenization: feed ids one at a time, get text once it is complete.

    A character split across tokens (byte-level BPE cuts emoji and CJK into bytes) decodes
    to U+FFFD until its last byte arrives, so text ending in U+FFFD is held back. Decoding a
    short window that starts a few tokens back keeps the cost per token constant and lets
    decoders that treat the first token specially (leading spaces) see context.
    """

    # A UTF-8 character has at most 4 bytes; after this many held tokens the U+FFFD is
    # real (the model emitted invalid bytes) and is passed on rather than held forever.
    MAX_HELD = 8

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: tokens before it are never decoded again
        self._read = 0  # tokens up to here have been turned into emitted text

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (often '', never a broken char)."""
        self._ids.append(int(token_id))
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        decode = self._tokenizer.decode
        done = decode(self._ids[self._prefix : self._read], self._skip)
        text = decode(self._ids[self._prefix :], self._skip)
        held = len(self._ids) - self._read
        if not final and (len(text) <= len(done) or text.endswith(REPLACEMENT)):
            if held < self.MAX_HELD:
                return ""
        # The window's first `done` characters were emitted last time; the rest is new.
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done) :]


# -- template environment --------------------------------------------------------------------


class _SandboxEnvironment(BoundedSandbox):
    """Raise on unsafe attribute access instead of rendering an empty Undefined."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text in some templates):
    rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **kw: Any) -> str:
    # Templates expect JSON text kept readable (no \\u escapes), as tool schemas are shown
    # to the model verbatim; markupsafe escaping does not apply to plain-text prompts.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, **kw)


def _read_tokenizer_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = read_json_file(path, TokenizerError, MAX_TOKENIZER_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: the top level must be a JSON object")
    return data


def _find_template(folder: Path, tok_config: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The chat template text and where it came from (for error messages)."""
    path = folder / TEMPLATE_FILE
    if path.is_file():
        limit = 4 * TemplateLimits.max_template_chars  # bytes: up to 4 per character
        try:
            if path.stat().st_size > limit:
                raise TokenizerError(
                    f"{path}: is {path.stat().st_size:,} bytes, over the {limit:,} a chat "
                    "template ever needs (Qwen3.5's is 8 KB); replace the file"
                )
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{path}: cannot be read ({exc})") from exc
    raw = tok_config.get("chat_template")
    where = f"{folder / TOKENIZER_CONFIG} [chat_template]"
    if isinstance(raw, str):
        return raw, where
    if isinstance(raw, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return named["default"], where
    return None, None


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None
