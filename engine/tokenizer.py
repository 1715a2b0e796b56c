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
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import Extension
from jinja2.sandbox import SecurityError
from tokenizers import Tokenizer as _HFTokenizer

from engine.errors import TemplateError, TemplateLimitError, TokenizerError, quoted
from engine.template_sandbox import BoundedSandbox, LimitHit, TemplateLimits, measure
from engine.tokenizer_files import (
    DEFAULT,
    TEMPLATE_FILE,
    TOKENIZER_CONFIG,
    TOOL_USE,
    ChatTemplates,
    find_templates,
    read_tokenizer_config,
    template_tokens,
    with_config_tokens,
)

TOKENIZER_FILE = "tokenizer.json"
MAX_TIME_FORMAT = 256  # characters of a strftime_now format
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # Qwen's thinking block
REPLACEMENT = "\ufffd"
# Where a message's reasoning may be; transformers copies it to `reasoning_content` and
# `thinking` before rendering, so a template reads it under either name.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Content parts that carry pictures, video or sound (OpenAI and Hugging Face spellings).
MEDIA_KEYS = frozenset(
    {"image", "image_url", "input_image", "video", "video_url", "audio", "input_audio", "file"}
)


class Tokenizer:
    """Text <-> token ids for one model, plus its chat template. Build with `load`."""

    # Budgets of one chat-template compile or render; set before the first render to change.
    template_limits = TemplateLimits()

    def __init__(
        self,
        tok: _HFTokenizer,
        *,
        source: Path,
        templates: ChatTemplates | None = None,
        special: Mapping[str, str] | None = None,
        eos_ids: Sequence[int] = (),
    ) -> None:
        self._tok = tok
        self.source = source
        self._templates = templates = templates or ChatTemplates()
        self.template = templates.default
        self.template_source = templates.default_source
        # The named `tool_use` template, which transformers picks over the default when
        # the request has tools.
        self.tool_template = templates.tool_use
        self._special = dict(special or {})  # bos_token, eos_token, ... for templates
        self._compiled_by_name: dict[str, jinja2.Template] = {}
        self.vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1
        self.eos_ids = self._collect_eos(eos_ids)
        self._byte_chars: dict[str, int] | None = None  # token_bytes, read at its first call
        self._added: set[int] = set()

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
        tok_config = read_tokenizer_config(folder / TOKENIZER_CONFIG)
        tok = with_config_tokens(tok, path, tok_config)
        return cls(
            tok,
            source=path,
            templates=find_templates(folder, tok_config),
            special=template_tokens(folder, tok_config),
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

    def id_to_token(self, token_id: int) -> str | None:
        """The token as the vocabulary spells it (byte-level BPE: `Ġ` for a space)."""
        return self._tok.id_to_token(int(token_id))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for. A byte-level BPE piece may be part of a character
        (its text alone would decode to U+FFFD); an added token (`<|im_end|>`) is its text."""
        if self._byte_chars is None:
            decoder = self._tok.decoder
            state = json.loads(decoder.__getstate__()) if decoder is not None else {}
            steps = state.get("decoders", [state])
            self._byte_chars = (
                {} if all(d.get("type") != "ByteLevel" for d in steps) else (_byte_level_chars())
            )
            self._added = set(self._tok.get_added_tokens_decoder())
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:
            return b""
        if self._byte_chars and int(token_id) not in self._added:
            try:
                return bytes(self._byte_chars[c] for c in piece)
            except KeyError:
                pass  # not a byte-level piece after all: its text below
        return self._tok.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")

    def hf_json(self) -> str:
        """The tokenizer as tokenizer.json holds it (for engine.constraint)."""
        return self._tok.to_str()

    # -- chat ----------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return self.template is not None or self.tool_template is not None

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render `messages` ([{"role", "content"}, ...]) with the model's chat template.

        The template sees what transformers' `apply_chat_template` gives it: keys whose value
        is None dropped, reasoning under `reasoning_content` and `thinking` whichever name
        it came under, `tools` and `documents` (None when absent), the tokenizer's named
        special tokens. `enable_thinking` is passed only when given, so the template's own
        default (thinking on for Qwen3.5 4B/9B, off for 0.8B/2B) applies otherwise. `tools`
        are OpenAI function specs, `{"type": "function", "function": {...}}`.

        Image, video and audio parts are refused with a TemplateError: Snug runs the text
        model only, and a picture's placeholder tokens without the picture mislead it.
        """
        chat = _chat_messages(messages)
        tools = None if tools is None else _tool_specs(tools)
        template = self._get_template(TOOL_USE if tools is not None else DEFAULT)
        variables: dict[str, Any] = {
            **self._special,
            "messages": chat,
            "tools": tools,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
        }
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        return self._render(template, variables)

    def _render(self, template: jinja2.Template, variables: dict[str, Any]) -> str:
        env = template.environment
        assert isinstance(env, _SandboxEnvironment)
        source = env.source  # the file (or tokenizer_config.json entry) the template is from
        try:
            return env.render_bounded(template, variables)
        except TemplateError:
            raise
        except SecurityError as exc:
            raise TemplateError(
                f"{source}: the chat template tried to reach outside its sandbox "
                f"({exc}); the template is unsafe, replace it or use raw prompts"
            ) from exc
        except (LimitHit, RecursionError, MemoryError) as exc:
            raise self._limit_error(exc, "rendering", source, variables) from None
        except Exception as exc:  # any Jinja or Python error inside the template
            raise TemplateError(
                f"{source}: rendering the chat template failed "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from exc

    def _limit_error(
        self,
        exc: BaseException,
        stage: str,
        source: str,
        variables: Mapping[str, Any] | None = None,
    ) -> TemplateLimitError:
        limits = self.template_limits
        if isinstance(exc, LimitHit) and variables is not None:
            # What the request gave the template (its messages with their attached files, its
            # tools): half the limit or more, and it is the conversation that is too long.
            given = {k: variables.get(k) for k in ("messages", "tools", "documents")}
            size = measure(given, limits)
            if 2 * size >= limits.max_size:
                most = limits.max_size
                amount = f"about {size:,}" if size <= most else f"over {most:,}"
                return TemplateLimitError(
                    "the conversation and its attached files are too long for the chat "
                    f"template: {amount} characters, and {source} renders at most {most:,}; "
                    "shorten the conversation (or start a new chat), or attach fewer or "
                    "smaller files"
                )
        if isinstance(exc, RecursionError):
            what = "nests too deeply (Python's recursion limit)"
        elif isinstance(exc, MemoryError):
            what = "ran out of memory"
        else:
            what = str(exc)
        return TemplateLimitError(
            f"{source}: {stage} the chat template was stopped: "
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

    def _get_template(self, name: str = DEFAULT) -> jinja2.Template:
        """The compiled template: `tool_use` (for a request with tools) when the model
        names one, else the default, as transformers' `get_chat_template` chooses. Each
        compiles in its own sandbox, whose errors name the file it came from."""
        found = self._templates
        text, source = (found.tool_use, found.tool_use_source) if name == TOOL_USE else (None, None)
        if text is None:
            name, text, source = DEFAULT, found.default, found.default_source
        if name in self._compiled_by_name:
            return self._compiled_by_name[name]
        if text is None:
            raise TokenizerError(self._no_template())
        source = source or TEMPLATE_FILE
        env = self._make_env(source)
        try:
            compiled = env.compile_bounded(text)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"{source}: line {exc.lineno}: the chat template is not valid Jinja ({exc.message})"
            ) from exc
        except (LimitHit, RecursionError, MemoryError) as exc:
            raise self._limit_error(exc, "compiling", source) from None
        except Exception as exc:  # Python's compiler refusing the generated code, and the like
            raise TemplateError(
                f"{source}: the chat template cannot be compiled ({type(exc).__name__}: "
                f"{str(exc)[:200]})"
            ) from exc
        self._compiled_by_name[name] = compiled
        return compiled

    def _no_template(self) -> str:
        """Why there is no template for a request without tools."""
        found = self._templates
        if not found.names:
            return (
                f"{self.source.parent}: no chat template (neither {TEMPLATE_FILE} nor "
                f"`chat_template` in {TOKENIZER_CONFIG}); use raw prompts for this model"
            )
        names = ", ".join(repr(n) for n in found.names)
        tools = f" ({TOOL_USE!r} is for requests with tools only)" if found.tool_use else ""
        return (
            f"{found.where}: chat templates named {names} but none named {DEFAULT!r}, the one "
            f"a request without tools renders with{tools}; add a default template or use raw "
            "prompts for this model"
        )

    def _make_env(self, source: str) -> _SandboxEnvironment:
        """The sandbox as transformers configures its own: trim_blocks, lstrip_blocks, loop
        controls, `{% generation %}`, its `tojson`, `raise_exception` and `strftime_now`."""

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
        env.globals["strftime_now"] = _strftime_now
        env.source = source
        return env


def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's, which Qwen's tokenizers use): the character that
    stands for each byte in the vocabulary's pieces, mapped back to the byte. Printable
    Latin-1 bytes stand for themselves; the others, in byte order, for U+0100 onwards. The
    `tokenizers` library decodes pieces to text only, so the bytes of a piece that is part
    of a character need this table."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: b for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = 0x100 + n
    return {chr(c): b for b, c in chars.items()}


class CloseWatch:
    """Watches a reply's text as it streams for `</think>`, which may come split over
    pieces: `feed` returns whether it has come (in this piece or before)."""

    def __init__(self) -> None:
        self.closed = False
        self._tail = ""  # the text since the last piece that could hold part of the tag

    def feed(self, text: str) -> bool:
        if not self.closed:
            self._tail = (self._tail + text)[-(len(THINK_CLOSE) + len(text)) :]
            self.closed = THINK_CLOSE in self._tail
        return self.closed


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
    """Raise on unsafe attribute access instead of rendering an empty Undefined. `source`:
    where the template compiled in it came from, for error messages."""

    source: str = TEMPLATE_FILE

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


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' own `tojson`, argument order included (`x|tojson(2)` sets ensure_ascii,
    # as there): JSON text kept readable (no \\u escapes), as tool schemas are shown to the
    # model verbatim, and no markupsafe escaping, which does not apply to plain-text prompts.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    """The current local time, as transformers provides it (Llama 3 and others date their
    system prompt with it)."""
    if not isinstance(format, str) or len(format) > MAX_TIME_FORMAT:
        raise LimitHit(
            f"calls strftime_now with a format other than a short string (at most "
            f"{MAX_TIME_FORMAT} characters)"
        )
    return datetime.now().strftime(format)


def _chat_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The messages as transformers hands them to a template: keys whose value is None
    dropped (clients send `"tool_calls": null`), reasoning copied to `reasoning_content` and
    `thinking` from whichever of those names or `reasoning` holds it; media refused."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise TemplateError(
            f"messages must be a list of {{'role': ..., 'content': ...}} objects, got "
            f"{quoted(messages)}"
        )
    if not messages:
        raise TemplateError("messages is empty: a chat needs at least one message")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(
                f"messages[{i}] must be an object with 'role' and 'content', got {quoted(message)}"
            )
        out = {key: value for key, value in message.items() if value is not None}
        _refuse_media(out.get("content"), i)
        reasoning = next((out[key] for key in REASONING_FIELDS if key in out), None)
        if reasoning is not None:
            out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
        chat.append(out)
    return chat


def _tool_specs(tools: Any) -> list[Any]:
    """`tools` as a list of function specs, as transformers takes them: any iterable of
    objects (a JSON schema each); anything else is refused rather than shown to the model."""
    try:
        specs = list(tools)
    except TypeError:
        specs = None
    if specs is None or specs and isinstance(tools, str | bytes | Mapping):
        raise TemplateError(f"tools must be a list of function specs, got {quoted(tools)}")
    for i, spec in enumerate(specs):
        if not isinstance(spec, Mapping):
            hint = ": send its JSON schema instead" if callable(spec) else ""
            raise TemplateError(
                f"tools[{i}] must be a function spec object ({{'type': 'function', "
                f"'function': {{'name': ..., 'parameters': ...}}}}), got {quoted(spec)}{hint}"
            )
    return specs


def _refuse_media(content: Any, index: int) -> None:
    """Raise a TemplateError naming the first image, video or audio part of `content`."""
    if not isinstance(content, Sequence) or isinstance(content, str | bytes):
        return
    for j, part in enumerate(content):
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        media = isinstance(kind, str) and kind in MEDIA_KEYS  # a type may be any JSON value
        keys = MEDIA_KEYS.intersection(k for k in part if isinstance(k, str))
        if media or keys:
            what = kind if media else sorted(keys)[0]
            raise TemplateError(
                f"messages[{index}].content[{j}] is a {quoted(what)} part: Snug runs the text "
                "part of the model only and cannot see images, video or audio. Send the text "
                "alone, or describe the picture in words"
            )
