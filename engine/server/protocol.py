"""Request bodies of the OpenAI API -> typed requests, with 4xx errors that name the field.

Unknown fields are ignored (clients send many); a known field with the wrong type or out of
range is refused with status 400 and `param` set to its name. Features this engine does not
have (several choices, echo, a suffix) are refused by name rather than silently ignored.
`response_format` (JSON mode, a JSON schema) and a forced `tool_choice` hold the reply to a
grammar (engine.constraint).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from typing import Any

from engine.attachments import Attachment, AttachmentRefused, compose, sent_file
from engine.constraint import json_grammar, tool_call_grammar
from engine.errors import RequestRefused
from engine.sampling import MAX_TOP_LOGPROBS, RECOMMENDED
from engine.scheduler import QueueFull
from engine.server.schema import RecursiveSchema, has_refs, inline_refs
from engine.session import GenerationParams

log = logging.getLogger("snug.server")
ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT_PARTS = ("text", "input_text", "output_text")


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


def in_range(name: str, value: Any, low: float, high: float, low_open: bool = False) -> Any:
    if value is None:
        return None
    if not low <= value <= high or (low_open and value == low):  # NaN too
        left = "(" if low_open else "["
        raise bad(f"'{name}' = {value} must be in {left}{low}, {high}]", name)
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
    max_tokens = field(body, "max_completion_tokens", "integer")
    if max_tokens is None:
        max_tokens = field(body, "max_tokens", "integer", max_tokens_default)
    if max_tokens == -1:  # "no limit", as LM Studio's clients send it: the context's room
        max_tokens = None
    if max_tokens is not None and max_tokens < 1:
        raise bad(f"'max_tokens' = {max_tokens} must be at least 1", "max_tokens")
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
        top_p=in_range("top_p", field(body, "top_p", "number"), 0, 1, low_open=True),
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
    )


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


# ----- chat -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatRequest:
    options: Options
    messages: list[dict[str, Any]]  # as the chat template reads them
    tools: list[dict[str, Any]] | None
    enable_thinking: bool | None
    one_call: bool = False  # `parallel_tool_calls: false`: the reply ends at its first call
    thinking_budget: int = 0  # the most tokens the reply thinks (0: no limit)


def read_chat(body: dict) -> ChatRequest:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("'messages' must be a non-empty list of messages", "messages")
    messages = system_first([_message(m, i) for i, m in enumerate(raw)])
    tools = field(body, "tools", "array")
    if tools is not None:
        tools = [_tool(t, i) for i, t in enumerate(tools)] or None
    options = read_options(body, None)
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        tools = None
    elif choice not in ("auto", None):
        options = replace(options, grammar=_forced_call(choice, tools))
    kwargs = field(body, "chat_template_kwargs", "object", {})
    thinking = field(kwargs, "enable_thinking", "boolean", None, "chat_template_kwargs.")
    if thinking is None and field(body, "reasoning_effort", "string") in ("none", "minimal"):
        thinking = False  # OpenAI's way to ask a reasoning model not to think
    one_call = not field(body, "parallel_tool_calls", "boolean", True)
    # Qwen's own API's name (DashScope's `thinking_budget`); Anthropic's `budget_tokens`.
    budget = field(body, "thinking_budget", "integer", 0)
    if budget < 0:
        raise bad(f"'thinking_budget' = {budget} must be a count of tokens", "thinking_budget")
    return ChatRequest(options, messages, tools, thinking, one_call, budget)


def system_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with one system message, first, as Qwen3.5's chat template takes them
    (it fails on any other: "System message must be at the beginning"), where clients send
    several (a front-end's and the user's, `instructions` and a developer message) or one
    later on (an agent's note mid-conversation): the leading ones joined into one, a later
    one kept in its place as a user message."""
    lead = 0
    while lead < len(messages) and messages[lead]["role"] == "system":
        lead += 1
    head = messages[:lead]
    if lead > 1:
        texts = [m["content"] for m in head if m["content"]]
        head = [{"role": "system", "content": "\n\n".join(texts)}]
    rest = [{**m, "role": "user"} if m["role"] == "system" else m for m in messages[lead:]]
    return head + rest


def _forced_call(choice: Any, tools: list[dict[str, Any]] | None) -> str:
    """`tool_choice` "required" or {"type": "function", "function": {"name": ...}}: the
    grammar that holds the reply to one call (of that tool). It takes the place of any
    `response_format`, as the OpenAI API does: the format shapes a text reply, and this
    reply is a call (agents send both: the final answer's format with a forced first call)."""
    name = None
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str):
            raise bad(
                "'tool_choice' must be 'auto', 'none', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
                "tool_choice",
            )
    elif choice != "required":
        raise bad(f"'tool_choice' = {json.dumps(choice)[:40]}: use auto, none or required",
                  "tool_choice")  # fmt: skip
    if not tools:
        raise bad("'tool_choice' asks for a tool call but the request has no 'tools'",
                  "tool_choice")  # fmt: skip
    if name is not None and name not in {t["function"]["name"] for t in tools}:
        raise bad(f"'tool_choice' names {name!r}, which is not in 'tools'", "tool_choice")
    try:
        return tool_call_grammar([_inlined(t) for t in tools], name, "tools")
    except RequestRefused as exc:
        raise bad(str(exc), "tools") from exc


def _inlined(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool with its parameters' `$ref`s written out in place (engine.server.schema): the
    call's grammar nests the parameters, where `#/$defs/...` would lead nowhere."""
    fn = tool["function"]
    params = fn.get("parameters")
    if not has_refs(params):
        return tool
    try:
        return {**tool, "function": {**fn, "parameters": inline_refs(params)}}
    except RecursiveSchema as exc:
        raise bad(
            f"the parameters of tool {fn['name']!r} contain themselves ($ref {exc}), which "
            "a forced 'tool_choice' cannot hold; send tool_choice 'auto' for this tool",
            "tool_choice",
        ) from None


def _message(message: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]."
    if not isinstance(message, dict):
        raise bad(f"'messages[{i}]' must be an object with 'role' and 'content'", f"messages[{i}]")
    role = field(message, "role", "string", None, where)
    if role not in ROLES:
        raise bad(f"'{where}role' must be one of {', '.join(ROLES)}", f"{where}role")
    out: dict[str, Any] = {
        "role": "system" if role == "developer" else role,
        "content": _content(message.get("content"), where),
    }
    if role == "assistant":
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if isinstance(reasoning, str):  # "" too: the template then leaves the content whole
            out["reasoning_content"] = reasoning
        calls = field(message, "tool_calls", "array", None, where)
        if calls:
            out["tool_calls"] = [
                _history_call(c, f"{where}tool_calls[{j}].") for j, c in enumerate(calls)
            ]
    if role == "tool":
        out["tool_call_id"] = field(message, "tool_call_id", "string", "", where)
    name = field(message, "name", "string", None, where)
    if name is not None:
        out["name"] = name
    return out


def _content(content: Any, where: str) -> str:
    """Text content: a string, or a list of parts: its text parts joined, after the files
    sent as `file` parts (text, PDF or Word, each fenced under its name: engine/attachments.py).
    Images are refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad(f"'{where}content' must be a string or a list of parts", f"{where}content")
    texts, files = [], []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        # Text parts as chat requests write them, as the Responses API's items do (clients
        # that share one message builder send those here too), or with no type at all.
        if kind in TEXT_PARTS or (kind is None and "text" in part):
            texts.append(field(part, "text", "string", "", f"{where}content."))
        elif kind == "file":
            files.append(sent_file_part(part, f"{where}content[{i}]"))
        else:
            raise bad(
                f"'{where}content' has a '{kind}' part: this server takes text and file "
                "(text, PDF or Word) parts only",
                f"{where}content",
            )
    return compose("".join(texts), files)


def sent_file_part(part: dict[str, Any], where: str) -> Attachment:
    """A chat `file` part ({"type": "file", "file": {"filename", "file_data"}}) read as a
    file attached to the message; the file's problem, by name, as a 400."""
    file = field(part, "file", "object", {}, f"{where}.")
    if file.get("file_id") is not None:
        raise bad(
            f"'{where}.file.file_id': this server keeps no uploaded files; send the file "
            "itself as 'file_data' (base64)",
            f"{where}.file",
        )
    data = field(file, "file_data", "string", None, f"{where}.file.")
    if not data:
        raise bad(f"'{where}.file.file_data' must hold the file (base64)", f"{where}.file")
    name = field(file, "filename", "string", "", f"{where}.file.") or "file"
    try:
        return sent_file(name, data)
    except AttachmentRefused as exc:
        raise bad(f"'{where}': {exc}", f"{where}.file") from None


def _history_call(call: Any, where: str) -> dict[str, Any]:
    """An earlier assistant tool call, with its arguments as a mapping (the template renders
    each argument; clients send them as a JSON string)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad(f"'{where}function.name' must be a string", f"{where}function")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            args = None
    elif args is None:
        args = {}
    if not isinstance(args, dict):
        shown = json.dumps(fn.get("arguments"), ensure_ascii=False)[:60]
        raise bad(
            f"'{where}function.arguments' must be a JSON object (as a string or an object), "
            f"got {shown}: send the call's arguments as the model gave them, or {{}}",
            f"{where}function.arguments",
        )
    function = {"name": fn["name"], "arguments": args}
    return {"id": call.get("id", ""), "type": "function", "function": function}


def _tool(tool: Any, i: int) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise bad(f"'tools[{i}]' must be {{'type': 'function', 'function': ...}}", f"tools[{i}]")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise bad(f"'tools[{i}].function.name' must be a non-empty string", f"tools[{i}]")
    if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
        raise bad(f"'tools[{i}].function.parameters' must be a JSON schema object", f"tools[{i}]")
    return {"type": "function", "function": fn}


def tool_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters' schema (to read a call's argument values)."""
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or ()}


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
