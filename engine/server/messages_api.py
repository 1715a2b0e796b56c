"""Anthropic's Messages API over the server's path (`OpenAIServer`: auth, body, model check
and submission are the server's): `POST /v1/messages` and `/v1/messages/count_tokens`, the
request read by messages.py, the reply's pieces as content blocks (`thinking`, `text`,
`tool_use`) in a message or in the stream's events; `GET /v1/models` in Anthropic's shape
for the clients that send `anthropic-version`. Each response carries a `request-id`
header (and an error its `request_id`), as Anthropic's do.

A stream sends `ping` events while nothing else goes out (the prompt being read, a request
waiting for a slot, a tool call being written: it is sent whole once it closes): Claude
Code gives up on a stream silent for 90 s, and a long prompt read, or a file written
through a tool, takes longer than that on a CPU or a small GPU.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from engine.errors import SnugError, TemplateError
from engine.server.chat_request import read_chat
from engine.server.errors import error_response
from engine.server.generation import Generation
from engine.server.messages import MessagesRequest, error_body, request_id
from engine.server.protocol import ApiError, bad, error_of, streamed_error
from engine.server.reply import Piece
from engine.server.sse import sse

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer

PING_S = 10.0  # seconds without an event after which a stream sends a ping


def signature(thinking: str) -> str:
    """A thinking block's `signature`: a digest of its text. Anthropic's clients keep the
    block, signature and all, to send it back with the conversation; here it is read as
    the thinking it holds."""
    return base64.b64encode(hashlib.sha256(thinking.encode("utf-8")).digest()).decode()


def _usage(gen: Generation) -> dict[str, int]:
    """The reply's usage as the API gives it, in the message and in the stream's
    message_delta (whose counts clients take as the final ones: LangChain's input tokens
    come from there): as in that API, `input_tokens` are the prompt's tokens read, and
    those restored from the engine's prompt cache are `cache_read_input_tokens` (known
    once the reply has ended; none before); none are written to a cache on request."""
    cached = gen.cached_tokens
    return {
        "input_tokens": gen.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": gen.completion_tokens,
    }


async def paced(pieces: AsyncGenerator[Piece], every: float) -> AsyncIterator[Piece | None]:
    """`pieces`, with None between them each time `every` seconds pass without one (the
    next piece is awaited in a task of its own, so that a ping does not cancel it)."""

    async def following() -> Piece:
        return await anext(pieces)

    waiting: asyncio.Task | None = None
    try:
        while True:
            if waiting is None:
                waiting = asyncio.create_task(following())
            done, _ = await asyncio.wait({waiting}, timeout=every)
            if not done:
                yield None
                continue
            task, waiting = waiting, None
            try:
                piece = task.result()
            except StopAsyncIteration:
                return
            yield piece
    finally:
        if waiting is not None:  # the stream ended early: so does the reply
            waiting.cancel()
        else:
            await pieces.aclose()


class MessageOutput:
    """One reply's content blocks, built from its pieces (`add`), and the message object."""

    def __init__(self, model: str, asked: int | None = None, prompt_only: bool = False) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.asked = asked  # the request's max_tokens (None: none sent)
        self.prompt_only = prompt_only  # max_tokens 0: the prompt read, nothing written
        self.blocks: list[dict[str, Any]] = []

    def usage(self, gen: Generation) -> dict[str, int]:
        """The reply's usage (`_usage`); a prompt read alone wrote nothing."""
        return {**_usage(gen), "output_tokens": 0} if self.prompt_only else _usage(gen)

    def add(self, piece: Piece) -> tuple[dict[str, Any], bool]:
        """Take one piece; (the block it went to, whether that block is new). A call's
        block opens at its "call_start" where it is streamed, and takes its input at its
        whole "tool_call"."""
        if piece.call is not None:
            call = piece.call
            tool_id = f"toolu_{call.id.removeprefix('call_')}"
            last = self.blocks[-1] if self.blocks else None
            if last is not None and last.get("id") == tool_id:
                if piece.kind == "tool_call":
                    last["input"] = call.arguments_object()
                return last, False
            block = {"type": "tool_use", "id": tool_id, "name": call.name, "input": {}}
            if piece.kind == "tool_call":
                block["input"] = call.arguments_object()
            self.blocks.append(block)
            return block, True
        kind = "thinking" if piece.kind == "reasoning" else "text"
        if self.blocks and self.blocks[-1]["type"] == kind:
            self.blocks[-1][kind] += piece.text
            return self.blocks[-1], False
        block = {"type": kind, kind: piece.text}
        self.blocks.append(block)
        return block, True

    def stop(self, gen: Generation) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) as the API gives them: a reply cut where the
        context ends, short of the max_tokens asked for (cut to the room left), stops with
        `model_context_window_exceeded`, as that API's does."""
        if self.prompt_only:
            return "max_tokens", None
        if gen.finish_reason == "length":
            cut = self.asked is None or self.asked > gen.params.max_new_tokens
            return ("model_context_window_exceeded" if cut else "max_tokens"), None
        if any(b["type"] == "tool_use" for b in self.blocks):
            return "tool_use", None
        if gen.stop.hit:
            return "stop_sequence", gen.stop.which
        return "end_turn", None

    def message(self, gen: Generation) -> dict[str, Any]:
        reason, sequence = self.stop(gen)
        content = [
            {**b, "signature": signature(b["thinking"])} if b["type"] == "thinking" else b
            for b in self.blocks
        ]
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self.usage(gen),
        }

    async def events(self, gen: Generation) -> AsyncIterator[str]:
        """The stream: message_start, each block's start / deltas / stop (a thinking block's
        signature last, as a signature_delta), message_delta with the stop reason and
        usage, message_stop; pings while no token comes."""

        def event(kind: str, **data: Any) -> str:
            payload = {"type": kind, **data}
            return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

        def block_stop(index: int) -> list[str]:
            block, out = self.blocks[index], []
            if block["type"] == "thinking":
                delta = {"type": "signature_delta", "signature": signature(block["thinking"])}
                out.append(event("content_block_delta", index=index, delta=delta))
            return [*out, event("content_block_stop", index=index)]

        head = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**_usage(gen), "output_tokens": 0},
        }
        yield event("message_start", message=head)
        try:
            async for piece in paced(gen.pieces(call_parts=True), PING_S):
                if piece is None:
                    yield event("ping")
                    continue
                if (piece.call is None and not piece.text) or self.prompt_only:
                    continue
                block, new = self.add(piece)
                index = len(self.blocks) - 1
                if new:
                    for line in block_stop(index - 1) if index > 0 else []:
                        yield line
                    if block["type"] == "tool_use":
                        start = {**block, "input": {}}
                    elif block["type"] == "thinking":
                        start = {"type": "thinking", "thinking": "", "signature": ""}
                    else:
                        start = {"type": "text", "text": ""}
                    yield event("content_block_start", index=index, content_block=start)
                if block["type"] == "tool_use":
                    if piece.kind == "call_args":
                        args = piece.text
                    elif piece.kind == "tool_call" and new:  # a call not streamed: whole
                        args = json.dumps(block["input"], ensure_ascii=False)
                    else:
                        continue
                    delta = {"type": "input_json_delta", "partial_json": args}
                elif block["type"] == "thinking":
                    delta = {"type": "thinking_delta", "thinking": piece.text}
                else:
                    delta = {"type": "text_delta", "text": piece.text}
                yield event("content_block_delta", index=index, delta=delta)
            for line in block_stop(len(self.blocks) - 1) if self.blocks else []:
                yield line
            reason, sequence = self.stop(gen)
            yield event(
                "message_delta",
                delta={"stop_reason": reason, "stop_sequence": sequence},
                usage=self.usage(gen),
            )
            yield event("message_stop")
        except Exception as exc:  # after the head went out: an error event
            yield event("error", error=error_body(streamed_error(exc))["error"])


def wants_anthropic(request: Request) -> bool:
    """Whether the client speaks Anthropic's API (its clients send `anthropic-version`)."""
    return "anthropic-version" in request.headers


class MessagesApi:
    """The routes, over the server's path (`OpenAIServer`)."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server

    def routes(self) -> list[tuple[str, Any, str]]:
        return [
            ("/messages", self.create, "POST"),
            ("/messages/count_tokens", self.count_tokens, "POST"),
        ]

    async def create(self, request: Request) -> Any:
        """A message, read as the chat request it stands for; its errors in Anthropic's
        shape. A `max_tokens` past the context's room is cut to it: Anthropic's clients
        send the most their model may write, whatever the context (a reply that ends there
        stops with `model_context_window_exceeded`). `max_tokens: 0` reads the prompt into
        the prompt cache and writes nothing, as that API pre-warms its cache."""
        s, rid, asked = self.server, request_id(), None
        try:
            s._authorize(request)
            asked = MessagesRequest(await s._body(request))
            chat = read_chat(asked.chat)
            s._check_model(chat.options.model)
            gen = await s._submit(request, chat, "messages", fit=True, started=asked.prefill)
        except (ApiError, SnugError) as exc:
            err = error_of(exc)
            err = asked.rename(err) if asked is not None else err
            return error_response(err, "anthropic", {"request-id": rid})
        limit = 0 if asked.prompt_only else chat.options.max_tokens
        out = MessageOutput(chat.options.model or s.model_id, limit, asked.prompt_only)
        if chat.options.stream:
            response: Any = sse(out.events(gen), gen)
        else:
            async for piece in gen.pieces():
                if (piece.kind == "tool_call" or piece.text) and not asked.prompt_only:
                    out.add(piece)
            response = JSONResponse(out.message(gen))
        response.headers["request-id"] = rid
        return response

    async def count_tokens(self, request: Request) -> Any:
        """The prompt a Messages request would run, in tokens."""
        s, rid, asked = self.server, request_id(), None
        try:
            s._authorize(request)
            body = await s._body(request)
            asked = MessagesRequest({**body, "stream": False, "max_tokens": None})
            chat = read_chat(asked.chat)
            s._check_model(chat.options.model)  # another model's count would be wrong
            try:
                _, ids = await run_in_threadpool(s._render, chat, asked.prefill)
            except TemplateError as exc:
                raise bad(str(exc), "messages", "template_error") from exc
        except (ApiError, SnugError) as exc:
            err = error_of(exc)
            err = asked.rename(err) if asked is not None else err
            return error_response(err, "anthropic", {"request-id": rid})
        return JSONResponse({"input_tokens": len(ids)}, headers={"request-id": rid})


def model_info(server: OpenAIServer) -> dict[str, Any]:
    """The served model as Anthropic's API describes one (`ModelInfo`): its context as
    both the most a prompt and the most a reply may take."""
    context = server.engine.context
    created = datetime.fromtimestamp(server.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": "model",
        "id": server.model_id,
        "display_name": server.model_id,
        "created_at": created,
        "lifecycle": "active",
        "max_input_tokens": context,
        "max_tokens": context,
    }


def model_list(server: OpenAIServer) -> JSONResponse:
    """`GET /v1/models` as Anthropic's API answers it: one page, the served model."""
    info = model_info(server)
    page = {"data": [info], "has_more": False, "first_id": info["id"], "last_id": info["id"]}
    return JSONResponse(page, headers={"request-id": request_id()})
