"""The Responses API's routes: `POST /v1/responses` (responses.py reads the request and
builds the reply) and the responses the server keeps, as OpenAI keeps them unless a request
says `store: false`: `GET` (with `stream=true`, its events again) and `DELETE
/v1/responses/{id}`, `GET /v1/responses/{id}/input_items` (the items it was asked with),
and `previous_response_id`, which goes on from a kept response's conversation (its input,
the conversation that input went on from, and its output) with only the new items sent, as
agents send their tool results; and `item_reference` input items, which name an item of a
kept response by its id (clients that send the conversation whole send earlier outputs so).
Neither `instructions` nor `tools` carry over, as in OpenAI's API.

The server keeps the most recent responses in memory (RESPONSES of them, KEPT_BYTES of
text at most), each with its own input and output only: a long conversation costs what it
says once, not once per turn. A response that is no longer kept is answered as not found,
by name; the conversation can then be sent whole in `input`.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from engine.server.chat_request import read_chat
from engine.server.logprobs import LogprobFormat
from engine.server.protocol import ApiError, bad
from engine.server.responses import ResponseOutput, ResponsesRequest, replayed
from engine.server.sse import SSE_HEADERS, sse

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer

RESPONSES = 512
KEPT_BYTES = 64 << 20


@dataclass
class Kept:
    previous: str | None  # the response this one went on from
    items: list[Any]  # its own input items
    response: dict[str, Any]
    size: int


class ResponseStore:
    """The responses kept, most recently used last; the oldest go past RESPONSES of them or
    KEPT_BYTES of their JSON."""

    def __init__(self, most: int = RESPONSES, most_bytes: int = KEPT_BYTES) -> None:
        self.most, self.most_bytes = most, most_bytes
        self._kept: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0
        # Item id -> (the kept response it came with, the item): for `item_reference`.
        self._items: dict[str, tuple[str, dict[str, Any]]] = {}

    def put(self, previous: str | None, items: list[Any], response: dict[str, Any]) -> None:
        items = [_identified(item) for item in items]
        size = len(json.dumps([items, response], ensure_ascii=False))
        kept = Kept(previous, items, response, size)
        self._kept[response["id"]] = kept
        self._bytes += size
        for item in _with_ids(kept):
            self._items[item["id"]] = (response["id"], item)
        while self._kept and (len(self._kept) > self.most or self._bytes > self.most_bytes):
            old_id, _ = next(iter(self._kept.items()))
            self.delete(old_id)

    def get(self, response_id: str) -> dict[str, Any] | None:
        kept = self._kept.get(response_id)
        return None if kept is None else kept.response

    def items(self, response_id: str) -> list[Any] | None:
        """The input items a kept response was asked with (each with an id), or None."""
        kept = self._kept.get(response_id)
        return None if kept is None else kept.items

    def item(self, item_id: str) -> dict[str, Any] | None:
        """The item of a kept response (its input or output) with the id `item_id`."""
        found = self._items.get(item_id)
        return None if found is None else found[1]

    def delete(self, response_id: str) -> bool:
        kept = self._kept.pop(response_id, None)
        if kept is None:
            return False
        self._bytes -= kept.size
        for item in _with_ids(kept):
            if self._items.get(item["id"], ("",))[0] == response_id:
                del self._items[item["id"]]
        return True

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        """The items of the conversation up to and with `response_id`'s output, oldest
        first (each response on the way marked recently used); a 400 naming
        `previous_response_id` where one of them is not kept."""
        chain: list[Kept] = []
        at: str | None = response_id
        while at is not None:
            kept = self._kept.get(at)
            if kept is None:
                went = "" if at == response_id else f" (the conversation went on from {at!r})"
                raise bad(
                    f"'previous_response_id': the response {at!r}{went} is not kept here: "
                    "it was sent with store false, deleted, or is older than the "
                    f"{self.most} most recent responses the server keeps; send the whole "
                    "conversation in 'input'",
                    "previous_response_id",
                    "previous_response_not_found",
                )
            self._kept.move_to_end(at)
            chain.append(kept)
            at = kept.previous
        out: list[dict[str, Any]] = []
        for kept in reversed(chain):
            out += kept.items
            out += kept.response["output"]
        return out


ID_PREFIXES = {"message": "msg", "function_call": "fc", "reasoning": "rs"}


def _identified(item: Any) -> Any:
    """An input item with an id of its own (as OpenAI gives each), for `input_items` and
    `item_reference`; one sent with an id keeps it."""
    if not isinstance(item, dict) or isinstance(item.get("id"), str):
        return item
    prefix = ID_PREFIXES.get(item.get("type", "message"), "item")
    return {"id": f"{prefix}_{uuid.uuid4().hex}", **item}


def _listed(item: Any) -> Any:
    """An input item as `input_items` lists it: a message typed, its text as a part."""
    if not isinstance(item, dict):
        return item
    out = {"type": "message", **item}
    if out["type"] == "message" and isinstance(out.get("content", ""), str):
        assistant = out.get("role") == "assistant"
        part = {
            "type": "output_text" if assistant else "input_text",
            "text": out.get("content", ""),
        }
        out["content"] = [{**part, "annotations": []} if assistant else part]
    if out["type"] in ("message", "function_call", "function_call_output"):
        out.setdefault("status", "completed")
    return out


def _with_ids(kept: Kept) -> list[dict[str, Any]]:
    """A kept response's items (input and output) that have an id to be named by."""
    items = [*kept.items, *kept.response["output"]]
    return [i for i in items if isinstance(i, dict) and isinstance(i.get("id"), str)]


class ResponsesApi:
    """The routes, over the server's path (`OpenAIServer`): auth, body, model check and
    submission are the server's."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self.store = ResponseStore()

    def routes(self) -> list[tuple[str, Any, str]]:
        return [
            ("/responses", self.create, "POST"),
            ("/responses/{response_id}", self.retrieve, "GET"),
            ("/responses/{response_id}", self.delete, "DELETE"),
            ("/responses/{response_id}/input_items", self.input_items, "GET"),
        ]

    async def create(self, request: Request) -> Any:
        """A response: the chat request it stands for, run on the server's path."""
        s = self.server
        s._authorize(request)
        body = await s._body(request)
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise bad("'previous_response_id' must be a string", "previous_response_id")
        earlier = self.store.conversation(previous) if previous else []
        asked = ResponsesRequest(body, earlier, self.store.item)
        try:
            chat = read_chat(asked.chat)
            s._check_model(chat.options.model)
            gen = await s._submit(request, chat, "input")
        except ApiError as exc:
            raise asked.rename(exc) from exc
        fmt = LogprobFormat(s.tokenizer) if chat.options.logprobs is not None else None
        out = ResponseOutput(body, chat.options.model or s.model_id, fmt)
        out.stored = body.get("store") is not False

        def keep(response: dict[str, Any]) -> None:
            if out.stored:
                self.store.put(previous, asked.items, response)

        if chat.options.stream:
            return sse(out.events(gen, keep), gen)
        async for piece in gen.pieces():
            if piece.kind != "content" or piece.text:
                out.add(piece, out.take_logprobs(gen, piece))
        response = out.response(gen)
        keep(response)
        return JSONResponse(response)

    async def retrieve(self, request: Request) -> JSONResponse | StreamingResponse:
        """A kept response; with `stream=true`, its events again (after `starting_after`)."""
        self.server._authorize(request)
        response_id = request.path_params["response_id"]
        response = self.store.get(response_id)
        if response is None:
            raise _not_found(response_id)
        query = request.query_params
        if query.get("stream", "false").lower() != "true":
            return JSONResponse(response)
        after = query.get("starting_after", "-1")
        if not after.lstrip("-").isdigit():
            raise bad(f"'starting_after' = {after!r} must be an event's sequence number",
                      "starting_after")  # fmt: skip
        events = replayed(response, int(after))
        return StreamingResponse(iter(events), media_type="text/event-stream", headers=SSE_HEADERS)

    async def delete(self, request: Request) -> JSONResponse:
        self.server._authorize(request)
        response_id = request.path_params["response_id"]
        if not self.store.delete(response_id):
            raise _not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def input_items(self, request: Request) -> JSONResponse:
        """The input items of a kept response, a page at a time: `order` (desc, newest
        first, unless asc), `limit` (1 to 100, 20 unless given) after the item `after`."""
        self.server._authorize(request)
        response_id = request.path_params["response_id"]
        items = self.store.items(response_id)
        if items is None:
            raise _not_found(response_id)
        query = request.query_params
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise bad(f"'order' = {order!r}: use asc or desc", "order")
        limit = query.get("limit", "20")
        if not limit.isdigit() or not 1 <= int(limit) <= 100:
            raise bad(f"'limit' = {limit!r} must be a whole number from 1 to 100", "limit")
        listed = [_listed(item) for item in items]
        listed = listed[::-1] if order == "desc" else listed
        after = query.get("after")
        if after is not None:
            at = [i for i, item in enumerate(listed) if item.get("id") == after]
            if not at:
                raise bad(f"'after' = {after!r} is not an input item of {response_id!r}",
                          "after")  # fmt: skip
            listed = listed[at[0] + 1 :]
        page = listed[: int(limit)]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(listed) > len(page),
            }
        )


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        404,
        f"no response {response_id!r} is kept here (sent with store false, deleted, or older "
        "than the responses the server keeps)",
        param="response_id",
        code="response_not_found",
    )
