"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/ps`, `/api/show`,
`/api/version`, and `/api/pull` of the served model, which is here already), for the
front-ends and the `ollama` client that speak it rather than OpenAI's. A request is read as
the chat (or, with `raw`, completion) request it stands for and runs on the same path; the
reply is Ollama's: the answer in `message.content` (`response` for generate), the thinking
in `thinking` when `think` is on, tool calls with their arguments as objects (each with its
`id` and, in `function`, its `index` in the reply), the tokens' log-probabilities where
`logprobs` asks, and the counts and durations (nanoseconds) at the end. It streams unless
`stream` is false, as newline-delimited JSON. Errors are `{"error": message}` (an unknown
model: 404, "model 'NAME' not found", as Ollama words it). The model stays loaded as long as
the server runs, so a request to unload it (`keep_alive` 0 with nothing to answer) is
refused by name. As Ollama does, a chat longer than the context loses its oldest turns
(engine/context_fit.py; `"truncate": false` refuses it instead), and `num_predict` past the
room left is cut to it. A chat that ends with the assistant's words goes on from them
(front-ends' "continue"), as Ollama's does. `/api/generate` answers with the conversation's
token ids as `context`, which a client sends back with its next prompt to go on from there
(the older way to keep a conversation, before `/api/chat`). The model's description
(`/api/tags`, `/api/ps`, `/api/show`) is ollama_models.py's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from engine import __version__
from engine.errors import SnugError
from engine.server.chat_request import read_chat
from engine.server.errors import MODELS_IN_APP, error_response
from engine.server.generation import Generation
from engine.server.logprobs import LogprobFormat
from engine.server.ollama_models import ModelCard, stamp
from engine.server.protocol import (
    ApiError,
    Options,
    bad,
    field,
    loose_sampling,
    read_completion,
    streamed_error,
)
from engine.server.reply import Piece

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer

# The Ollama release whose API these routes answer as (`think` with levels, `tool_name`,
# `truncate`, `logprobs`, tool calls with their `id`), as /api/version reports it.
OLLAMA_VERSION = "0.12.11"
# Ollama's sampling options and the chat request's names for them. Its others are the
# runner's (`num_ctx`: the context is the server's own, `--context`; `num_gpu`,
# `num_thread`, ...) or samplers this engine does not have (`repeat_penalty`, `mirostat`,
# `typical_p`, which Ollama's own engine does not apply either): they are ignored, as
# Ollama ignores the options it does not know. `temperature` and `top_p` are read as its
# sampler takes them (any temperature; protocol.loose_sampling), after the chat request.
OPTIONS = {
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# The chat request's fields that an Ollama request sends under other names, as its errors
# name them.
SENT_AS = {ours: f"options.{name}" for name, ours in OPTIONS.items()} | {
    "max_tokens": "options.num_predict",
    "response_format": "format",
    "response_format.json_schema.schema": "format",
}
# What /api/generate refuses by name rather than drop (Ollama's `template` is a Go template).
REFUSED = {
    "images": "this server takes text prompts",
    "suffix": "this server takes text prompts",
    "template": "this server renders the model's own chat template; send a prompt formatted "
    "as you want it with raw: true",
}
THINK_LEVELS = ("low", "medium", "high", "max")  # and "none", as OpenAI's clients say off
MAX_TOP_LOGPROBS = 20
_DURATION = re.compile(r"(\d*\.?\d+)(ns|us|µs|ms|s|m|h)")
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def chat_body(body: dict[str, Any], generate: bool) -> dict[str, Any]:
    """The chat body an Ollama chat or generate request stands for."""
    if generate:
        prompt = field(body, "prompt", "string", "")
        for name, why in REFUSED.items():
            if body.get(name):
                raise bad(f"'{name}' is not supported: {why}", name)
        messages = [{"role": "user", "content": prompt}]
        system = field(body, "system", "string")
        if system:
            messages.insert(0, {"role": "system", "content": system})
    else:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad("'messages' must be a non-empty list of messages", "messages")
        messages = [_message(m, i) for i, m in enumerate(raw)]
    chat: dict[str, Any] = {"messages": messages, "model": body.get("model")}
    chat["stream"] = field(body, "stream", "boolean", True)
    options = field(body, "options", "object", {})
    for name, ours in OPTIONS.items():
        if options.get(name) is not None:
            chat[ours] = options[name]
    predict = field(options, "num_predict", "integer", where="options.")  # typed, as Ollama's
    if predict is not None and predict > 0:  # -1 and -2: no limit but the context's
        chat["max_tokens"] = predict
    if body.get("tools"):
        chat["tools"] = body["tools"]  # OpenAI's function tools, as Ollama takes them
    fmt = body.get("format")
    if fmt == "json":
        chat["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt}}
    elif fmt not in (None, ""):
        raise bad("'format' must be \"json\" or a JSON schema", "format")
    think = body.get("think")
    if think is not None:  # true, false, or a level: Qwen3.5 thinks or not, at one level
        if not isinstance(think, bool) and think not in (*THINK_LEVELS, "none"):
            raise bad(
                f"invalid think value {json.dumps(think)[:40]}: use true, false or a level "
                '("low", "medium", "high", "max")',
                "think",
            )
        chat["chat_template_kwargs"] = {"enable_thinking": think not in (False, "none")}
    if field(body, "logprobs", "boolean", False):
        top = field(body, "top_logprobs", "integer", 0)
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")
        chat |= {"logprobs": True, "top_logprobs": top}
    return chat


def _message(message: Any, i: int) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise bad(f"'messages[{i}]' must be an object with 'role' and 'content'", f"messages[{i}]")
    if message.get("images"):
        raise bad(f"'messages[{i}].images': this server takes text only", f"messages[{i}].images")
    out = {k: message[k] for k in ("role", "content") if k in message}
    if isinstance(out.get("role"), str):
        out["role"] = out["role"].lower()  # as Ollama reads it ("User" is a user)
    if message.get("thinking"):
        out["reasoning_content"] = message["thinking"]
    if message.get("tool_calls"):
        if not isinstance(message["tool_calls"], list):
            where = f"messages[{i}].tool_calls"
            raise bad(f"'{where}' must be a list of tool calls", where)
        out["tool_calls"] = [
            {"type": "function", "function": c.get("function", {})} if isinstance(c, dict) else c
            for c in message["tool_calls"]
        ]
    if message.get("tool_name"):
        out["name"] = message["tool_name"]
    return out


def prefill(chat: dict[str, Any]) -> str:
    """A chat that ends with the assistant's words (no tool call) goes on from them, as
    Ollama renders Qwen3.5's chat (front-ends' "continue" sends the reply so far): that
    message taken out of `chat` and returned, the reply written after it, without
    thinking first; "" where the chat ends otherwise."""
    messages = chat["messages"]
    last = messages[-1]
    text = last.get("content")
    if len(messages) < 2 or last.get("role") != "assistant" or last.get("tool_calls"):
        return ""
    if not isinstance(text, str) or not text:
        return ""
    messages.pop()
    chat["chat_template_kwargs"] = {"enable_thinking": False}
    return text


def keep_alive(body: dict[str, Any]) -> float | None:
    """`keep_alive` in seconds (None where it is not sent; negative: for ever): a number of
    seconds, or a duration as Ollama reads it ("5m", "1h30m", "0")."""
    value = body.get("keep_alive")
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        sign, text = (-1.0 if text.startswith("-") else 1.0), text.lstrip("+-")
        try:
            return sign * float(text)  # "0", and seconds as a string
        except ValueError:
            parts = _DURATION.findall(text)
        if parts and "".join(n + unit for n, unit in parts) == text:
            return sign * sum(float(n) * _SECONDS[unit] for n, unit in parts)
    raise bad(
        f'\'keep_alive\' = {json.dumps(value)[:40]}: send a duration such as "5m" or "1h", '
        "or a number of seconds",
        "keep_alive",
    )


class Reply:
    """One Ollama reply: its pieces gathered (`add`) into content, thinking and tool calls,
    and the objects the API answers with; the tokens' log-probabilities with the lines
    that follow them, where the request asked (`logprobs`)."""

    def __init__(
        self,
        model: str,
        generate: bool,
        keeps_context: bool = False,
        logprobs: LogprobFormat | None = None,
    ) -> None:
        self.model, self.generate = model, generate
        self.keeps_context = keeps_context  # a templated generate: `context` at the end
        self.logprobs = logprobs
        self.t0 = time.perf_counter_ns()
        self.content, self.thinking = "", ""
        self.calls: list[dict[str, Any]] = []

    def add(self, piece: Piece) -> dict[str, Any]:
        """Take one piece; the part of a streamed line it makes."""
        if piece.kind == "tool_call":
            call = piece.call
            assert call is not None
            function = {"index": len(self.calls), "name": call.name}
            one = {"id": call.id, "function": {**function, "arguments": call.arguments_object()}}
            self.calls.append(one)
            return {"tool_calls": [one]}
        if piece.kind == "reasoning":
            self.thinking += piece.text
            return {"thinking": piece.text}
        self.content += piece.text
        return {"content": piece.text}

    def line(
        self, part: dict[str, Any], done: bool = False, gen: Generation | None = None
    ) -> dict[str, Any]:
        """A response object: `part` as the message (chat) or as its fields (generate),
        with the log-probabilities of `gen`'s tokens since the last line."""
        out: dict[str, Any] = {"model": self.model, "created_at": stamp(datetime.now(UTC))}
        if self.generate:
            out["response"] = part.get("content", "")
            if part.get("thinking"):
                out["thinking"] = part["thinking"]
            if part.get("tool_calls"):
                out["tool_calls"] = part["tool_calls"]
        else:
            out["message"] = {
                "role": "assistant",
                "content": part.get("content", ""),
                **{k: part[k] for k in ("thinking", "tool_calls") if part.get(k)},
            }
        out["done"] = done
        if gen is not None and self.logprobs is not None:
            entries = gen.take_logprobs()
            if entries or done:
                out["logprobs"] = self.logprobs.chat(entries)["content"]
        return out

    def final(self, gen: Generation, whole: bool) -> dict[str, Any]:
        """The last object: the whole reply (`whole`: not streamed), the reason it ended,
        the counts and durations."""
        part: dict[str, Any] = {}
        if whole:
            part = {"content": self.content, "thinking": self.thinking, "tool_calls": self.calls}
        out = self.line(part, done=True, gen=gen)
        total = time.perf_counter_ns() - self.t0
        # The prompt up to the first token, the reply after it (`ollama run --verbose` divides
        # eval_count by eval_duration for its eval rate); the whole time where the engine's
        # own timings did not come (a reply cut at a stop string).
        prompt = int(gen.stats.ttft_s * 1e9) if gen.stats is not None else 0
        prompt = min(prompt, total - 1) if total > 1 else 0
        out |= {
            "done_reason": "length" if gen.finish_reason == "length" else "stop",
            "total_duration": total,
            "load_duration": 0,
            "prompt_eval_count": gen.prompt_tokens,
            "prompt_eval_duration": prompt,
            "eval_count": gen.completion_tokens,
            "eval_duration": total - prompt,
        }
        if self.keeps_context:  # the prompt and the reply, to send back as `context`: the
            # tokens the reply was read from, not those the engine ran ahead with before a
            # cancel (at a stop string) reached it
            out["context"] = [*gen.prompt_ids, *gen.reply_ids]
        return out


class OllamaApi:
    """Ollama's routes over the server's path (`OpenAIServer`): auth, body, model check and
    submission are the server's."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self._card: ModelCard | None = None

    @property
    def card(self) -> ModelCard:
        """The served model as Ollama's routes describe it (worked out on first use)."""
        if self._card is None:
            self._card = ModelCard(self.server)
        return self._card

    def routes(self) -> list[Route]:
        return [
            Route("/", self.root, methods=["GET"]),  # HEAD too (Starlette adds it)
            Route("/api/version", self.version, methods=["GET"]),
            Route("/api/tags", self.tags, methods=["GET"]),
            Route("/api/ps", self.running, methods=["GET"]),
            Route("/api/show", self.show, methods=["POST"]),
            Route("/api/pull", self.pull, methods=["POST"]),
            Route("/api/chat", self.chat, methods=["POST"]),
            Route("/api/generate", self.generate, methods=["POST"]),
        ]

    async def root(self, request: Request) -> PlainTextResponse:
        """Ollama's answer at its root, which front-ends and scripts probe (HEAD or GET)
        before they use the server; no key needed, as for /health."""
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> JSONResponse:
        """The version of Ollama whose API this one answers as: clients compare it with the
        least they need (VS Code's Copilot refuses a server below 0.6.4); Snug's own
        version beside it."""
        return JSONResponse({"version": OLLAMA_VERSION, "snug_version": __version__})

    def _check(self, model: Any) -> None:
        """`model` is the served one, its name in any case as Ollama matches names (with
        the tag ":latest" or none); else a 404 in Ollama's words ("model 'NAME' not
        found"), which its clients show as it is, with the name that is served."""
        served = self.server.model_id.lower()
        if isinstance(model, str) and model.lower() in (served, f"{served}:latest"):
            return
        try:
            self.server._check_model(model)
        except ApiError as exc:
            raise ApiError(
                404,
                f"model '{model}' not found; this server serves '{self.server.model_id}' "
                "(GET /api/tags lists it)",
                param="model",
                code="model_not_found",
            ) from exc

    async def tags(self, request: Request) -> Response:
        try:
            self.server._authorize(request)
        except ApiError as exc:
            return _error(exc)
        return JSONResponse({"models": [self.card.listed()]})

    async def running(self, request: Request) -> Response:
        """`ollama ps`: the one model this server runs, with the memory it holds, loaded
        until the server stops."""
        try:
            self.server._authorize(request)
        except ApiError as exc:
            return _error(exc)
        return JSONResponse({"models": [self.card.running()]})

    async def show(self, request: Request) -> Response:
        """The model's details, its context length (`model_info`, and `num_ctx` in
        `parameters`) and capabilities, by `model` or by `name` as older clients send it."""
        try:
            _, model = await self._naming(request)
            self._check(model)
        except ApiError as exc:
            return _error(exc)
        return JSONResponse(self.card.shown())

    async def _naming(self, request: Request) -> tuple[dict[str, Any], str]:
        """The body of a request about one model, and the model it names (`model`, or
        `name` as older clients send it); authorized."""
        s = self.server
        s._authorize(request)
        body = await s._body(request)
        model = body.get("model") or body.get("name")
        if not model:
            raise bad("model is required", "model")
        return body, model

    async def pull(self, request: Request) -> Response:
        """`ollama pull`: the served model is here already, so its pull succeeds at once
        (scripts pull a model before they use it), whole or as a stream of one line;
        another is refused by name, with where models come from."""
        s = self.server
        try:
            body, model = await self._naming(request)
            stream = field(body, "stream", "boolean", True)
            try:
                self._check(model)
            except ApiError:
                message = f"'{model}' is not the model served here ('{s.model_id}'): "
                raise ApiError(404, message + MODELS_IN_APP, param="model") from None
        except ApiError as exc:
            return _error(exc)
        done = {"status": "success"}
        if stream:
            return Response(json.dumps(done) + "\n", media_type="application/x-ndjson")
        return JSONResponse(done)

    async def chat(self, request: Request) -> Any:
        return await self._run(request, generate=False)

    async def generate(self, request: Request) -> Any:
        return await self._run(request, generate=True)

    async def _run(self, request: Request, generate: bool) -> Any:
        s = self.server
        try:
            s._authorize(request)
            body = await s._body(request)
            alive = keep_alive(body)
            if _loads_only(body, generate):  # how Ollama's clients ask for the model ready
                self._check(body.get("model"))
                if alive == 0:
                    raise bad(_NO_UNLOAD.format(model=s.model_id), "keep_alive")
                reply = Reply(body.get("model") or s.model_id, generate)
                return JSONResponse({**reply.line({}, done=True), "done_reason": "load"})
            earlier = context_ids(body, s.engine.vocab_rows) if generate else []
            raw = generate and bool(body.get("raw"))
            if raw:
                gen, stream = await self._raw(request, body, earlier)
            else:
                asked = chat_body(body, generate)
                started = "" if generate else prefill(asked)
                chat = read_chat(asked)
                chat = replace(chat, options=sampled(chat.options, body))
                self._check(chat.options.model)
                truncate = not generate and body.get("truncate", True) is not False
                gen = await s._submit(
                    request,
                    chat,
                    "messages",
                    fit=True,
                    truncate=truncate,
                    prefix=earlier,
                    started=started,
                )
                stream = chat.options.stream
        except ApiError as exc:
            return _error(as_sent(exc))
        except SnugError as exc:
            return _error(exc)
        fmt = LogprobFormat(s.tokenizer) if gen.wants_logprobs else None
        reply = Reply(body.get("model") or s.model_id, generate, generate and not raw, fmt)
        if stream:
            return StreamingResponse(
                _lines(reply, gen),
                media_type="application/x-ndjson",
                background=BackgroundTask(gen.cancel),
            )
        try:
            async for piece in gen.pieces():
                if piece.kind == "tool_call" or piece.text:
                    reply.add(piece)
        except (ApiError, SnugError) as exc:
            return _error(exc)
        return JSONResponse(reply.final(gen, whole=True))

    async def _raw(
        self, request: Request, body: dict[str, Any], earlier: list[int]
    ) -> tuple[Generation, bool]:
        """generate with `raw`: the prompt as it is, no template (a completion), after the
        `context` ids where they are sent, `num_predict` past the room left cut to it as for a
        templated prompt. A system prompt has no place in it: refused, as Ollama refuses it."""
        s = self.server
        if body.get("system"):
            raise bad("raw mode does not support 'system': write it into the prompt", "system")
        chat = chat_body({**body, "raw": False}, generate=True)  # its options, read once
        dropped = ("messages", "tools", "chat_template_kwargs", "logprobs", "top_logprobs")
        completion = {k: v for k, v in chat.items() if k not in dropped}
        if chat.get("logprobs"):  # a completion's `logprobs` is the count of alternatives
            completion["logprobs"] = chat["top_logprobs"]
        prompt: Any = field(body, "prompt", "string", "")
        if earlier:
            prompt = earlier + s.tokenizer.encode(prompt)
        req = read_completion({**completion, "prompt": prompt})
        req = replace(req, options=sampled(req.options, body))
        self._check(req.options.model)
        return await s._submit_completion(request, req, fit=True), req.options.stream


_NO_UNLOAD = (
    "'{model}' stays loaded as long as this server runs, so it is not unloaded here "
    "(keep_alive 0); stop the server to free its memory"
)


def context_ids(body: dict[str, Any], vocab: int) -> list[int]:
    """`context`: the token ids an earlier /api/generate answered with."""
    ids = field(body, "context", "array", [])
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
        raise bad(
            f"'context' must be the token ids an earlier reply gave (whole numbers in "
            f"[0, {vocab})); send it back unchanged, or leave it out to start afresh",
            "context",
        )
    return ids


def sampled(options: Options, body: dict[str, Any]) -> Options:
    """`options` with the request's `options.temperature` and `options.top_p` as Ollama's
    sampler takes them: any temperature (a negative one as 0), a top_p past 1 as 1."""
    return loose_sampling(options, field(body, "options", "object", {}), "options.")


def as_sent(exc: ApiError) -> ApiError:
    """`exc` naming the field as the Ollama request sent it (`options.top_k`, `format`)."""
    name = SENT_AS.get(exc.param or "")
    if name is None:
        return exc
    message = exc.message.replace(f"'{exc.param}'", f"'{name}'")
    return ApiError(exc.status, message, exc.kind, name, exc.code)


def _loads_only(body: dict[str, Any], generate: bool) -> bool:
    """A request with nothing to answer (no prompt, or no messages): in Ollama's API it
    loads the model and answers `done_reason: "load"`; here the model is loaded already."""
    if generate:
        return not body.get("prompt")
    return body.get("messages") in (None, [])


async def _lines(reply: Reply, gen: Generation) -> AsyncIterator[str]:
    try:
        async for piece in gen.pieces():
            if piece.kind == "tool_call" or piece.text:
                line = reply.line(reply.add(piece), gen=gen)
                yield json.dumps(line, ensure_ascii=False) + "\n"
        yield json.dumps(reply.final(gen, whole=False), ensure_ascii=False) + "\n"
    except Exception as exc:  # the reply failed after it started: its error, as a line
        yield json.dumps({"error": streamed_error(exc).message}, ensure_ascii=False) + "\n"


def _error(exc: Exception) -> Response:
    return error_response(exc, "ollama")
