"""Request bodies of the OpenAI API -> typed requests, with 4xx errors that name the field.

Unknown fields are ignored (clients send many); a known field with the wrong type or out of
range is refused with status 400 and `param` set to its name. Features this engine does not
have (echo, a suffix, `best_of` above `n`) are refused by name rather than silently ignored.
`response_format` (JSON mode, a JSON schema) holds the reply to a grammar
(engine.constraint). What a chat request holds (messages, tools, a forced `tool_choice`) is
read by chat_request.py.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from engine.constraint import json_grammar
from engine.errors import RequestRefused
from engine.sampling import MAX_TOP_LOGPROBS, RECOMMENDED
from engine.scheduler import QueueFull
from engine.session import GenerationParams

log = logging.getLogger("snug.server")


class ApiError(Exception):
    """An error answered in the OpenAI shape: `{"error": {message, type, param, code}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status,
            message,
            kind,
            param,
            code,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# ----- typed field readers ---------------------------------------------------------------------
_KINDS = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def error_of(exc: Exception) -> ApiError:
    """The API's error for any exception a request raised (a bug: a 500 in the same shape)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFull):
        return ApiError(503, str(exc), "server_overloaded", code="queue_full")
    if isinstance(exc, RequestRefused):
        return bad(str(exc))
    return ApiError(500, f"{type(exc).__name__}: {exc}", "server_error")


def streamed_error(exc: Exception) -> ApiError:
    """The API error that ends a stream already under way; the server's own failures (500)
    are logged, as uvicorn logs them for a reply that had not started."""
    err = error_of(exc)
    if err.status >= 500 and not isinstance(exc, ApiError):
        log.error("a streamed reply failed", exc_info=exc)
    return err


def renamed(exc: ApiError, origin: list[str], words: dict[str, str] | None = None) -> ApiError:
    """`exc`, raised reading a chat body made from another API's request, with that API's
    names put back: `messages[i]` as `origin[i]` (the field chat message i came from), and
    each pattern of `words` as its name there."""

    def names(text: str | None) -> str | None:
        if text is None:
            return None

        def back(m: re.Match) -> str:
            i = int(m.group(1))
            return origin[i] if i < len(origin) else m.group(0)

        text = re.sub(r"messages\[(\d+)\]", back, text)
        for pattern, name in (words or {}).items():
            text = re.sub(pattern, name, text)
        return text

    param = names(exc.param)
    return ApiError(exc.status, names(exc.message) or "", exc.kind, param, exc.code)


def field(body: dict, name: str, kind: str, default: Any = None, where: str = "") -> Any:
    """`body[name]` if it is of `kind` (JSON type name); `default` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not _KINDS[kind](value):
        param = f"{where}{name}"
        raise bad(f"'{param}' must be of type {kind}, got {json.dumps(value)[:60]}", param)
    return value


def in_range(name: str, value: Any, low: float, high: float) -> Any:
    if value is None:
        return None
    if not low <= value <= high:  # NaN too
        raise bad(f"'{name}' = {value} must be in [{low}, {high}]", name)
    return value


# ----- what chat and completions share --------------------------------------------------------
@dataclass(frozen=True)
class Options:
    """Sampling and output options common to both endpoints (None: the engine's default)."""

    model: str | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    presence_penalty: float | None
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    ignore_eos: bool
    grammar: str | None = None  # `response_format`'s (engine.constraint), or None: free text
    # Each token's log-probability with this many alternatives (None: not asked).
    logprobs: int | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, value added to its logit)
    n: int = 1  # replies to the prompt (chat and completions); the other APIs take one
    limit_name: str = "max_tokens"  # the field `max_tokens` was read from, for its errors

    def choice(self, i: int) -> Options:
        """The options of reply `i` of `n`: a seed moves on by one a reply, so that seeded
        replies differ from each other and each is the same again with the same seed."""
        seed = self.seed if self.seed is None or i == 0 else (self.seed + i) % 2**63
        return replace(self, seed=seed, n=1)

    def params(self, max_new_tokens: int, thinking: bool = False) -> GenerationParams:
        """The request's sampling; the knobs it leaves out take the values Qwen3.5's model
        cards recommend for a reply that thinks first, or for one that does not
        (`thinking`; engine.sampling.RECOMMENDED), all but the presence penalty, which stays
        off as in OpenAI's API unless asked."""
        defaults = {k: v for k, v in RECOMMENDED[thinking].items() if k != "presence_penalty"}
        given = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed,
        }
        chosen = {k: v for k, v in given.items() if v is not None}
        if chosen.get("top_p") == 0:  # a nucleus of no mass: the single likeliest token
            chosen |= {"top_p": 1.0, "top_k": 1}
        return GenerationParams(
            max_new_tokens=max_new_tokens,
            grammar=self.grammar,
            logprobs=self.logprobs,
            logit_bias=self.logit_bias,
            **{**defaults, **chosen},
        )


def read_logprobs(body: dict, chat: bool) -> int | None:
    """The alternatives each token's log-probability comes with, or None where none are
    asked: chat's `logprobs` (true / false) and `top_logprobs` (0 to 20), completions'
    `logprobs` (a count, 0 to 20)."""
    if chat:
        top = in_range("top_logprobs", field(body, "top_logprobs", "integer"), 0, MAX_TOP_LOGPROBS)
        if not field(body, "logprobs", "boolean", False):
            if top:
                raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
            return None
        return top or 0
    value = body.get("logprobs")
    if isinstance(value, bool):  # some clients send chat's form here
        return 0 if value else None
    return in_range("logprobs", field(body, "logprobs", "integer"), 0, MAX_TOP_LOGPROBS)


def read_choices(body: dict) -> int:
    """`n`: the replies asked for the prompt (each its own request, drawn apart). The
    completions' `best_of` may only say the same: every reply written is returned."""
    n = field(body, "n", "integer", 1)
    if n < 1:
        raise bad(f"'n' = {n} must be at least 1", "n")
    best_of = field(body, "best_of", "integer", n)
    if best_of != n:
        raise bad(
            f"'best_of' = {best_of}: this server returns every reply it writes, so best_of "
            f"must equal n ({n}) or be left out",
            "best_of",
        )
    return n


def read_options(body: dict, max_tokens_default: int | None, chat: bool = True) -> Options:
    limit = "max_completion_tokens"  # OpenAI's newer name, which takes the place of the other
    max_tokens = field(body, limit, "integer")
    if max_tokens is None:
        limit = "max_tokens"
        max_tokens = field(body, limit, "integer", max_tokens_default)
    if max_tokens == -1:  # "no limit", as LM Studio's clients send it: the context's room
        max_tokens = None
    if max_tokens is not None and max_tokens < 1:
        raise bad(f"'{limit}' = {max_tokens} must be at least 1", limit)
    top_k = field(body, "top_k", "integer")
    if top_k is not None and top_k < -1:
        raise bad(f"'top_k' = {top_k} must be -1 or 0 (off) or a positive count", "top_k")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 16:
        stops = tuple(stop)
    else:
        raise bad("'stop' must be a string or a list of at most 16 strings", "stop")
    options = field(body, "stream_options", "object", {})
    return Options(
        model=field(body, "model", "string"),
        max_tokens=max_tokens,
        temperature=in_range("temperature", field(body, "temperature", "number"), 0, 2),
        top_p=in_range("top_p", field(body, "top_p", "number"), 0, 1),
        top_k=max(top_k, 0) if top_k is not None else None,
        min_p=in_range("min_p", field(body, "min_p", "number"), 0, 0.999999),
        presence_penalty=in_range(
            "presence_penalty", field(body, "presence_penalty", "number"), -2, 2
        ),
        seed=_seed(field(body, "seed", "integer")),
        stop=tuple(s for s in stops if s),
        stream=field(body, "stream", "boolean", False),
        include_usage=field(options, "include_usage", "boolean", False, "stream_options."),
        ignore_eos=field(body, "ignore_eos", "boolean", False),
        grammar=read_response_format(body),
        logprobs=read_logprobs(body, chat),
        frequency_penalty=in_range(
            "frequency_penalty", field(body, "frequency_penalty", "number"), -2, 2
        ),
        logit_bias=read_logit_bias(body),
        n=read_choices(body),
        limit_name=limit,
    )


def loose_sampling(options: Options, body: dict, where: str = "") -> Options:
    """`options` with `body`'s temperature and top_p as Ollama's and llama.cpp's samplers
    take them, where OpenAI's API holds them to [0, 2] and [0, 1]: any temperature (a
    negative one as 0: the likeliest token), a top_p past 1 as 1 (off). `where`: the
    fields' prefix in the request (`options.`), for the errors."""
    values = {}
    for name in ("temperature", "top_p"):
        value = field(body, name, "number", None, where)
        if value is None:
            continue
        if not math.isfinite(value):
            raise bad(f"'{where}{name}' = {value} must be a finite number", f"{where}{name}")
        values[name] = max(float(value), 0.0)
    if "top_p" in values:
        values["top_p"] = min(values["top_p"], 1.0)
    return replace(options, **values)


def read_logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """`logit_bias`: {token id (as a string): a value from -100 to 100 added to its logit}
    (-100 bars the token, 100 all but forces it); the ids are checked against the
    vocabulary where the model is known (OpenAIServer._start)."""
    raw = field(body, "logit_bias", "object", {})
    out = []
    for key, value in raw.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            raise bad(f"'logit_bias' key {key!r} must be a token id (a whole number)",
                      "logit_bias")  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"'logit_bias[{key}]' must be a number", "logit_bias")
        in_range(f"logit_bias[{key}]", value, -100, 100)
        if value:
            out.append((int(key), float(value)))
    return tuple(sorted(out))


def _seed(seed: int | None) -> int | None:
    """The sampler's seed; a negative one (-1, as llama.cpp's and Ollama's clients send
    it) asks for none: a different draw each time."""
    if seed is None or seed < 0:
        return None
    return in_range("seed", seed, 0, 2**63 - 1)


def read_response_format(body: dict) -> str | None:
    """`response_format` -> the grammar the reply is held to: none for text, any JSON object
    for `json_object`, the schema's JSON for `json_schema` (engine.constraint; whole where it
    is `strict`, else as far as the grammar can hold it)."""
    fmt = field(body, "response_format", "object", {})
    kind = field(fmt, "type", "string", "text", "response_format.")
    if kind == "text":
        return None
    strict = False
    if kind == "json_object":
        schema, where = None, "response_format"
    elif kind == "json_schema":
        spec = field(fmt, "json_schema", "object", None, "response_format.")
        if spec is None:
            raise bad("'response_format.json_schema' is required with type json_schema",
                      "response_format.json_schema")  # fmt: skip
        where = "response_format.json_schema.schema"
        schema = field(spec, "schema", "object", None, "response_format.json_schema.")
        strict = field(spec, "strict", "boolean", False, "response_format.json_schema.")
    else:
        raise bad(
            f"'response_format.type' = {json.dumps(kind)[:40]}: use text, json_object or "
            "json_schema",
            "response_format.type",
        )
    try:
        return json_grammar(schema, where, strict)
    except RequestRefused as exc:
        raise bad(str(exc), where) from exc


# ----- completions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CompletionRequest:
    options: Options
    prompts: tuple[str | list[int], ...]  # a batch: each prompt's replies are choices

    @property
    def prompt(self) -> str | list[int]:
        """The one prompt of an API that takes one (llama.cpp's)."""
        if len(self.prompts) != 1:
            raise bad(f"'prompt' holds {len(self.prompts)} prompts; send one", "prompt")
        return self.prompts[0]


def read_completion(body: dict) -> CompletionRequest:
    raw = body.get("prompt")
    batch = isinstance(raw, list) and bool(raw) and all(isinstance(p, str | list) for p in raw)
    prompts = raw if batch else [raw]
    for i, prompt in enumerate(prompts):
        ints = isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        )
        if not (isinstance(prompt, str) or ints) or not prompt:
            where = f"prompt[{i}]" if batch else "prompt"
            raise bad(
                f"'{where}' must be a non-empty string or list of token ids (or 'prompt' a "
                "list of them, a batch)",
                "prompt",
            )
    if field(body, "echo", "boolean", False):
        raise bad("'echo' is not supported by this server", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported by this server", "suffix")
    return CompletionRequest(read_options(body, 16, chat=False), tuple(prompts))
