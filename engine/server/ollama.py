"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/ps`, `/api/show`,
`/api/version`),
for the front-ends and the `ollama` client that speak it rather than OpenAI's. A request is
read as the chat (or, with `raw`, completion) request it stands for and runs on the same
path; the reply is Ollama's: the answer in `message.content` (`response` for generate), the
thinking in `thinking` when `think` is on, tool calls with their arguments as objects, and
the counts and durations (nanoseconds) at the end. It streams unless `stream` is false, as
newline-delimited JSON. Errors are `{"error": message}`. As Ollama does, a chat longer than
the context loses its oldest turns (engine/context_fit.py; `"truncate": false` refuses it
instead), and `num_predict` past the room left is cut to it. `/api/generate` answers with
the conversation's token ids as `context`, which a client sends back with its next prompt
to go on from there (the older way to keep a conversation, before `/api/chat`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from engine import __version__
from engine.errors import SnugError
from engine.server.errors import error_response
from engine.server.generation import Generation
from engine.server.protocol import (
    ApiError,
    bad,
    field,
    read_chat,
    read_completion,
    streamed_error,
)
from engine.server.reply import Piece

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer

# The Ollama release whose API these routes answer as (`think` with levels, `tool_name`,
# `truncate`, `logprobs` refused by name), as /api/version reports it.
OLLAMA_VERSION = "0.12.6"
# Ollama's sampling options and the chat request's names for them.
OPTIONS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def chat_body(body: dict[str, Any], generate: bool) -> dict[str, Any]:
    """The chat body an Ollama chat or generate request stands for."""
    if generate:
        prompt = field(body, "prompt", "string", "")
        if body.get("images") or body.get("suffix"):
            name = "images" if body.get("images") else "suffix"
            raise bad(f"'{name}' is not supported: this server takes text prompts", name)
        messages = [{"role": "user", "content": prompt}]
        system = field(body, "system", "string")
        if system:
            messages.insert(0, {"role": "system", "content": system})
    else:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad("'messages' must be a non-empty list of messages", "messages")
        messages = [_message(m, i) for i, m in enumerate(raw)]
    if body.get("logprobs"):
        raise bad(
            "'logprobs' is not supported on /api; /v1/chat/completions returns them", "logprobs"
        )
    chat: dict[str, Any] = {"messages": messages, "model": body.get("model")}
    chat["stream"] = field(body, "stream", "boolean", True)
    options = field(body, "options", "object", {})
    for name, ours in OPTIONS.items():
        if options.get(name) is not None:
            chat[ours] = options[name]
    predict = options.get("num_predict")
    if isinstance(predict, int) and predict > 0:
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
    if think is not None:  # true, false, or a level ("low", "medium", "high")
        chat["chat_template_kwargs"] = {"enable_thinking": think not in (False, "none")}
    return chat


def _message(message: Any, i: int) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise bad(f"'messages[{i}]' must be an object with 'role' and 'content'", f"messages[{i}]")
    if message.get("images"):
        raise bad(f"'messages[{i}].images': this server takes text only", f"messages[{i}].images")
    out = {k: message[k] for k in ("role", "content") if k in message}
    if message.get("thinking"):
        out["reasoning_content"] = message["thinking"]
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"type": "function", "function": c.get("function", {})} if isinstance(c, dict) else c
            for c in message["tool_calls"]
        ]
    if message.get("tool_name"):
        out["name"] = message["tool_name"]
    return out


class Reply:
    """One Ollama reply: its pieces gathered (`add`) into content, thinking and tool calls,
    and the objects the API answers with."""

    def __init__(self, model: str, generate: bool, keeps_context: bool = False) -> None:
        self.model, self.generate = model, generate
        self.keeps_context = keeps_context  # a templated generate: `context` at the end
        self.t0 = time.perf_counter_ns()
        self.content, self.thinking = "", ""
        self.calls: list[dict[str, Any]] = []

    def add(self, piece: Piece) -> dict[str, Any]:
        """Take one piece; the part of a streamed line it makes."""
        if piece.kind == "tool_call":
            call = piece.call
            assert call is not None
            args = call.arguments_object()
            one = {"function": {"name": call.name, "arguments": args}}
            self.calls.append(one)
            return {"tool_calls": [one]}
        if piece.kind == "reasoning":
            self.thinking += piece.text
            return {"thinking": piece.text}
        self.content += piece.text
        return {"content": piece.text}

    def line(self, part: dict[str, Any], done: bool = False) -> dict[str, Any]:
        """A response object: `part` as the message (chat) or as its fields (generate)."""
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        out: dict[str, Any] = {"model": self.model, "created_at": now}
        if self.generate:
            out["response"] = part.get("content", "")
            if part.get("thinking"):
                out["thinking"] = part["thinking"]
        else:
            out["message"] = {
                "role": "assistant",
                "content": part.get("content", ""),
                **{k: part[k] for k in ("thinking", "tool_calls") if part.get(k)},
            }
        out["done"] = done
        return out

    def final(self, gen: Generation, whole: bool) -> dict[str, Any]:
        """The last object: the whole reply (`whole`: not streamed), the reason it ended,
        the counts and durations."""
        part: dict[str, Any] = {}
        if whole:
            part = {"content": self.content, "thinking": self.thinking, "tool_calls": self.calls}
        out = self.line(part, done=True)
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
        if self.keeps_context:  # the prompt and the reply, to send back as `context`
            out["context"] = [*gen.request.prompt_ids, *gen.request.generated]
        return out


class OllamaApi:
    """Ollama's routes over the server's path (`OpenAIServer`): auth, body, model check and
    submission are the server's."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server

    def routes(self) -> list[Route]:
        return [
            Route("/", self.root, methods=["GET"]),  # HEAD too (Starlette adds it)
            Route("/api/version", self.version, methods=["GET"]),
            Route("/api/tags", self.tags, methods=["GET"]),
            Route("/api/ps", self.running, methods=["GET"]),
            Route("/api/show", self.show, methods=["POST"]),
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

    def _model(self) -> dict[str, Any]:
        s = self.server
        when = datetime.fromtimestamp(s.created, UTC).isoformat().replace("+00:00", "Z")
        tensors = s.engine.checkpoint.tensors
        details = {
            "format": "safetensors",
            "family": "qwen3_5",
            "families": ["qwen3_5"],
            "parameter_size": parameter_size(tensors.values()),
            "quantization_level": quantization_level(tensors.values()),
        }
        return {
            "name": s.model_id,
            "model": s.model_id,
            "modified_at": when,
            "size": s.engine.checkpoint.total_bytes,
            "digest": "",
            "details": details,
        }

    async def tags(self, request: Request) -> JSONResponse:
        try:
            self.server._authorize(request)
        except ApiError as exc:
            return _error(exc)
        return JSONResponse({"models": [self._model()]})

    async def running(self, request: Request) -> JSONResponse:
        """`ollama ps`: the one model this server runs, with the bytes it holds on the card,
        loaded until the server stops."""
        try:
            self.server._authorize(request)
        except ApiError as exc:
            return _error(exc)
        model = self._model()
        model["size_vram"] = self.server.engine.held_bytes()
        model["expires_at"] = FOREVER
        model["context_length"] = self.server.engine.context
        return JSONResponse({"models": [model]})

    async def show(self, request: Request) -> JSONResponse:
        s = self.server
        try:
            s._authorize(request)
            body = await s._body(request)
            s._check_model(body.get("model") or body.get("name"))
        except ApiError as exc:
            return _error(exc)
        info = {"general.architecture": "qwen3_5", "qwen3_5.context_length": s.engine.context}
        return JSONResponse(
            {
                "details": self._model()["details"],
                "model_info": info,
                "capabilities": ["completion", "tools", "thinking"],
                "template": s.tokenizer.template or "",
            }
        )

    async def chat(self, request: Request) -> Any:
        return await self._run(request, generate=False)

    async def generate(self, request: Request) -> Any:
        return await self._run(request, generate=True)

    async def _run(self, request: Request, generate: bool) -> Any:
        s = self.server
        try:
            s._authorize(request)
            body = await s._body(request)
            if _loads_only(body, generate):  # how Ollama's clients ask for the model ready
                s._check_model(body.get("model"))
                reply = Reply(body.get("model") or s.model_id, generate)
                return JSONResponse({**reply.line({}, done=True), "done_reason": "load"})
            earlier = context_ids(body, s.engine.vocab_rows) if generate else []
            raw = generate and bool(body.get("raw"))
            if raw:
                gen, stream = await self._raw(request, body, earlier)
            else:
                chat = read_chat(chat_body(body, generate))
                s._check_model(chat.options.model)
                truncate = not generate and body.get("truncate", True) is not False
                gen = await s._submit(
                    request, chat, "messages", fit=True, truncate=truncate, prefix=earlier
                )
                stream = chat.options.stream
        except (ApiError, SnugError) as exc:
            return _error(exc)
        reply = Reply(body.get("model") or s.model_id, generate, generate and not raw)
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
        `context` ids where they are sent."""
        s = self.server
        chat = chat_body({**body, "raw": False}, generate=True)  # its options, read once
        dropped = ("messages", "tools", "chat_template_kwargs")
        completion = {k: v for k, v in chat.items() if k not in dropped}
        prompt: Any = field(body, "prompt", "string", "")
        if earlier:
            prompt = earlier + s.tokenizer.encode(prompt)
        req = read_completion({**completion, "prompt": prompt})
        s._check_model(req.options.model)
        return await s._submit_completion(request, req), req.options.stream


# A model stays loaded until the server stops: `expires_at` as Ollama writes "never".
FOREVER = "2318-08-28T00:00:00Z"


def parameter_size(tensors: Any) -> str:
    """The checkpoint's parameter count as Ollama writes it ("751.63M", "4.21B")."""
    count = sum(int(np.prod(t.shape)) for t in tensors)
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"


def quantization_level(tensors: Any) -> str:
    """How the matrices are stored: "Q4" (with its group size, MLX affine) or the float type."""
    quant = next((t.quant for t in tensors if t.quant is not None), None)
    if quant is not None:
        return f"Q{quant.bits}_G{quant.group_size}"
    dtypes = {t.dtype for t in tensors if len(t.shape) == 2}
    return next(iter(dtypes)).upper() if len(dtypes) == 1 else "/".join(sorted(dtypes)).upper()


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


def _loads_only(body: dict[str, Any], generate: bool) -> bool:
    """A request with nothing to answer (no prompt, or no messages): in Ollama's API it
    loads the model and answers `done_reason: "load"`; here the model is loaded already."""
    if generate:
        return not body.get("prompt") and not body.get("system")
    return body.get("messages") == []


async def _lines(reply: Reply, gen: Generation) -> AsyncIterator[str]:
    try:
        async for piece in gen.pieces():
            if piece.kind == "tool_call" or piece.text:
                yield json.dumps(reply.line(reply.add(piece)), ensure_ascii=False) + "\n"
        yield json.dumps(reply.final(gen, whole=False), ensure_ascii=False) + "\n"
    except Exception as exc:  # the reply failed after it started: its error, as a line
        yield json.dumps({"error": streamed_error(exc).message}, ensure_ascii=False) + "\n"


def _error(exc: Exception) -> Response:
    return error_response(exc, "ollama")
