"""The Responses API (`POST /v1/responses`), as the `openai` client's `responses.create` and
the agents built on it send it. A request is read as the chat request it stands for (the
same checks, chat template, grammar, reply splitting and scheduler), and the reply's pieces
become output items: a `reasoning` item for the thinking, a `message` with `output_text`,
a `function_call` per tool call. The conversation comes whole in `input` (its earlier
calls and their outputs as `function_call` and `function_call_output` items), or goes on
from a response the server keeps (`previous_response_id`: engine/server/response_store.py).
With `include: ["message.output_text.logprobs"]` (and `top_logprobs`), each output text
carries its tokens' log-probabilities, as chat's `logprobs` gives them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from engine.server.generation import Generation
from engine.server.logprobs import LogprobFormat
from engine.server.protocol import ApiError, bad, field, renamed, streamed_error
from engine.server.reply import Piece
from engine.tokenizer import THINK_CLOSE

TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for them


class ResponsesRequest:
    """A Responses body read as a chat body (`chat`), with where each chat message came from
    in `input` (`origin`), so that an error about `messages[i]` names the input item.
    `earlier`: the items of the conversation `previous_response_id` goes on from."""

    def __init__(
        self,
        body: dict[str, Any],
        earlier: Sequence[dict[str, Any]] = (),
        refer: Callable[[str], dict[str, Any] | None] = lambda item_id: None,
    ) -> None:
        self.body = body
        if body.get("conversation") is not None:
            raise bad(
                "'conversation' is not supported: this server keeps no conversations; send "
                "the whole conversation in 'input', or go on from a response with "
                "'previous_response_id'",
                "conversation",
            )
        if body.get("background"):
            raise bad(
                "'background' is not supported: this server answers while you wait", "background"
            )
        raw = body.get("input")
        if isinstance(raw, str):
            raw = [{"type": "message", "role": "user", "content": raw}]
        elif not isinstance(raw, list) or not raw:
            raise bad("'input' must be a string or a non-empty list of items", "input")
        # This request's own input items (kept with its response), each `item_reference`
        # as the kept item it names (`refer`).
        self.items: list[Any] = [_referred(item, i, refer) for i, item in enumerate(raw)]
        self.origin: list[str] = []
        self.chat = self._chat_body(list(earlier))

    def _chat_body(self, earlier: list[dict[str, Any]]) -> dict[str, Any]:
        body = self.body
        messages: list[dict[str, Any]] = []
        instructions = field(body, "instructions", "string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
            self.origin.append("instructions")
        named = [("previous_response_id", item) for item in earlier]
        named += [(f"input[{i}]", item) for i, item in enumerate(self.items)]
        reasoning = None  # a reasoning item's text, for the assistant turn after it
        for where, item in named:
            if not isinstance(item, dict):
                raise bad(f"'{where}' must be an object", where)
            kind = item.get("type", "message")
            if kind == "message":
                messages.append(self._message(item, where))
            elif kind == "function_call":
                call = {
                    "id": field(item, "call_id", "string", "", f"{where}."),
                    "type": "function",
                    "function": {
                        "name": field(item, "name", "string", None, f"{where}."),
                        "arguments": field(item, "arguments", "string", "{}", f"{where}."),
                    },
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant":  # the same turn
                    last.setdefault("tool_calls", []).append(call)
                    continue
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind == "function_call_output":
                output = item.get("output", "")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": field(item, "call_id", "string", "", f"{where}."),
                        "content": output if isinstance(output, str) else _parts(output),
                    }
                )
            elif kind == "reasoning":
                parts = [*(item.get("content") or []), *(item.get("summary") or [])]
                reasoning = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
                continue
            else:
                raise bad(
                    f"'{where}.type' = {json.dumps(kind)[:40]} is not supported: use "
                    "message, function_call, function_call_output, reasoning or "
                    "item_reference",
                    f"{where}.type",
                )
            self.origin.append(where)
            if reasoning and messages[-1]["role"] == "assistant":
                messages[-1]["reasoning_content"], reasoning = reasoning, None
        chat: dict[str, Any] = {"messages": messages}
        for name in (
            "model",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stream",
            "presence_penalty",
            "chat_template_kwargs",
            "stop",
        ):
            if name in body:
                chat[name] = body[name]
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        tools = field(body, "tools", "array")
        if tools:
            chat["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "function":
            choice = {"type": "function", "function": {"name": choice.get("name")}}
        if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
            named = [  # each as chat's {"type": "function", "function": {"name"}}
                {"type": "function", "function": {"name": t.get("name")}}
                if isinstance(t, dict) and "function" not in t
                else t
                for t in field(choice, "tools", "array", [], "tool_choice.")
            ]
            spec = {"mode": choice.get("mode"), "tools": named}
            choice = {"type": "allowed_tools", "allowed_tools": spec}
        if choice is not None:
            chat["tool_choice"] = choice
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
        include = field(body, "include", "array", [])
        if LOGPROBS in include:
            chat["logprobs"] = True
            chat["top_logprobs"] = body.get("top_logprobs")
        fmt = field(field(body, "text", "object", {}), "format", "object", None, "text.")
        if fmt is not None:
            chat["response_format"] = _format(fmt)
        effort = field(field(body, "reasoning", "object", {}), "effort", "string", None)
        if effort in ("none", "minimal"):  # no thinking block
            kwargs = chat.setdefault("chat_template_kwargs", {})
            if isinstance(kwargs, dict):
                kwargs.setdefault("enable_thinking", False)
        return chat

    def _message(self, item: dict[str, Any], where: str) -> dict[str, Any]:
        content = item.get("content", "")
        return {
            "role": item.get("role"),
            "content": content if isinstance(content, str) else _parts(content),
        }

    def rename(self, exc: ApiError) -> ApiError:
        """`exc` with the chat request's names put back as this request's: messages[i] as
        the input item it came from, max_tokens as max_output_tokens, response_format as
        text.format, 'messages' as 'input'."""
        words = {
            r"\bmax_tokens\b": "max_output_tokens",
            r"\bresponse_format(\.json_schema)?": "text.format",
            r"'messages'": "'input'",
            r"^messages$": "input",
        }
        return renamed(exc, self.origin, words)


def _referred(item: Any, i: int, refer: Callable[[str], dict[str, Any] | None]) -> Any:
    """An input item; an `item_reference` as the item of a kept response it names."""
    if not isinstance(item, dict) or item.get("type") != "item_reference":
        return item
    item_id = field(item, "id", "string", None, f"input[{i}].")
    found = refer(item_id) if item_id else None
    if found is None:
        raise bad(
            f"'input[{i}]' refers to the item {item_id!r}, which is not kept here: no "
            "response the server keeps has it (sent with store false, deleted, or older than "
            "the responses kept); send the item itself",
            f"input[{i}]",
        )
    return found


def _parts(parts: Any) -> list[dict[str, Any]]:
    """Responses content parts as chat parts: text as text, an `input_file` with its data as
    a chat file part (read there: engine/attachments.py); any other part kept for the chat
    reader, which refuses it by name (images)."""
    if not isinstance(parts, list):
        return parts
    out = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            out.append({"type": "text", "text": part.get("text", part.get("refusal", ""))})
        elif kind == "input_file":
            if part.get("file_url") is not None:
                raise bad("an 'input_file' with a 'file_url': this server fetches nothing; "
                          "send the file itself as 'file_data' (base64)", "input")  # fmt: skip
            keys = ("file_data", "filename", "file_id")
            out.append({"type": "file", "file": {k: part.get(k) for k in keys}})
        else:
            out.append(part)
    return out


def _tool(tool: Any, i: int) -> Any:
    """A Responses function tool ({"type": "function", "name", "parameters", ...}) as chat's."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise bad(
            f"'tools[{i}]' is a '{kind}' tool: this server runs function tools only", f"tools[{i}]"
        )
    if "function" in tool:
        return tool  # already in chat's form
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": fn}


def _format(fmt: dict[str, Any]) -> dict[str, Any]:
    """`text.format` as chat's `response_format`."""
    if fmt.get("type") != "json_schema":
        return fmt
    spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


class ResponseOutput:
    """One reply's output items, built from its pieces (`add`), and the response object.
    `logprobs`: the format of the tokens' log-probabilities where the request asked for them
    (each output text then has its tokens', and each streamed text delta the delta's)."""

    def __init__(
        self, body: dict[str, Any], model: str, logprobs: LogprobFormat | None = None
    ) -> None:
        self.body = body
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.items: list[dict[str, Any]] = []
        self.logprobs = logprobs
        self.stored = False  # kept for `previous_response_id` (response_store.py)

    def _open(self, kind: str) -> dict[str, Any]:
        """The item that a piece of `kind` continues: the last one if it is of that kind."""
        want = {"reasoning": "reasoning", "content": "message"}[kind]
        if self.items and self.items[-1]["type"] == want:
            return self.items[-1]
        if want == "reasoning":
            item = {
                "type": "reasoning",
                "id": f"rs_{uuid.uuid4().hex}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
            }
        else:
            part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": []}
            if self.logprobs is not None:
                part["logprobs"] = []
            item = {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "role": "assistant",
                "status": "completed",
                "content": [part],
            }
        self.items.append(item)
        return item

    def take_logprobs(self, gen: Generation, piece: Piece) -> list[dict[str, Any]]:
        """The log-probabilities of the tokens `gen` received since the last call, where the
        request asked for them and `piece` is answer text (a thinking or a call: none). The
        answer's first text comes after the tokens that closed the thinking (`</think>` and
        the line breaks after it), which are not the answer's."""
        if self.logprobs is None or not gen.wants_logprobs:
            return []
        entries = gen.take_logprobs()
        if piece.kind != "content":
            return []
        last = self.items[-1] if self.items else None
        if last is None or last["type"] != "message" or not last["content"][0]["text"]:
            tokenizer = self.logprobs.tokenizer
            ids = [token for token, _ in entries]
            close = tokenizer.token_to_id(THINK_CLOSE)
            if close in ids:
                entries = entries[len(ids) - ids[::-1].index(close) :]
            while entries and not piece.text[:1].isspace():
                if tokenizer.token_bytes(entries[0][0]).strip():
                    break
                entries = entries[1:]
        return self.logprobs.chat(entries)["content"]

    def add(
        self, piece: Piece, logprobs: Sequence[dict[str, Any]] = ()
    ) -> tuple[dict[str, Any], bool]:
        """Take one piece (and its text's token `logprobs`); (the item it went to, whether
        that item is new)."""
        if piece.call is not None:  # a call: opened at its "call_start" where streamed
            call = piece.call
            last = self.items[-1] if self.items else None
            if last is not None and last.get("call_id") == call.id:
                if piece.kind == "call_args":
                    last["arguments"] += piece.text
                else:
                    last.update(arguments=call.arguments, status="completed")
                return last, False
            done = piece.kind == "tool_call"
            item = {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed" if done else "in_progress",
            }
            self.items.append(item)
            return item, True
        count = len(self.items)
        item = self._open(piece.kind)
        item["content"][0]["text"] += piece.text
        if logprobs:
            item["content"][0]["logprobs"].extend(logprobs)
        return item, len(self.items) > count

    def cut(self, gen: Generation) -> bool:
        """Whether the reply was cut by its token limit; its last message, the one cut, is
        then marked "incomplete", as OpenAI marks it."""
        if gen.finish_reason != "length":
            return False
        if self.items and self.items[-1]["type"] == "message":
            self.items[-1]["status"] = "incomplete"
        return True

    def response(self, gen: Generation | None, status: str = "completed") -> dict[str, Any]:
        body = self.body
        incomplete = None
        if gen is not None and self.cut(gen):
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        usage = None
        if gen is not None:
            u = gen.usage
            usage = {
                "input_tokens": u["prompt_tokens"],
                "input_tokens_details": u["prompt_tokens_details"],
                "output_tokens": u["completion_tokens"],
                "output_tokens_details": u["completion_tokens_details"],
                "total_tokens": u["total_tokens"],
            }
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": self.model,
            "status": status,
            "incomplete_details": incomplete,
            "error": None,
            "instructions": body.get("instructions"),
            "output": self.items if gen is not None else [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "text": body.get("text") or {"format": {"type": "text"}},
            "top_logprobs": body.get("top_logprobs"),
            "truncation": "disabled",
            "store": self.stored,
            "metadata": body.get("metadata") or {},
            "usage": usage,
        }

    async def events(
        self, gen: Generation, keep: Callable[[dict[str, Any]], None] | None = None
    ) -> AsyncIterator[str]:
        """The stream: response.created, each item's added / delta / done events, then
        response.completed (or .incomplete); `keep` takes the final response first."""
        seq = 0

        def event(kind: str, **data: Any) -> str:
            nonlocal seq
            seq += 1
            return _event(kind, seq - 1, data)

        start = self.response(None, "in_progress")
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        try:
            async for piece in gen.pieces(call_parts=True):
                if piece.kind == "content" and not piece.text:
                    continue
                logprobs = self.take_logprobs(gen, piece)
                before = self.items[-1] if self.items else None
                item, new = self.add(piece, logprobs)
                index = len(self.items) - 1
                if new and before is not None:
                    for kind, data in _item_done(before, index - 1):
                        yield event(kind, **data)
                if item["type"] == "function_call":
                    if new:
                        added = {**item, "arguments": "", "status": "in_progress"}
                        yield event("response.output_item.added", output_index=index, item=added)
                    # A call's text: each part as it is written, or a call not streamed whole.
                    text = piece.text if piece.kind == "call_args" else ""
                    text = item["arguments"] if piece.kind == "tool_call" and new else text
                    if text:
                        yield event(
                            "response.function_call_arguments.delta",
                            item_id=item["id"],
                            output_index=index,
                            delta=text,
                        )
                    continue
                if new:
                    empty = _emptied(item)
                    yield event("response.output_item.added", output_index=index, item=empty)
                    yield event(
                        "response.content_part.added",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        part=empty["content"][0],
                    )
                delta = "response.output_text.delta"
                if item["type"] == "reasoning":
                    delta = "response.reasoning_text.delta"
                extra = {"logprobs": logprobs} if item["type"] == "message" else {}
                yield event(
                    delta,
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=piece.text,
                    **extra,
                )
            if self.items:
                self.cut(gen)  # the last item's status, before its done event
                for kind, data in _item_done(self.items[-1], len(self.items) - 1):
                    yield event(kind, **data)
            final = self.response(gen)
            if keep is not None:
                keep(final)
            yield event(f"response.{final['status']}", response=final)
        except Exception as exc:  # after the head went out: an error event
            err = streamed_error(exc)
            yield event("error", code=err.code, message=err.message, param=err.param)


def _event(kind: str, seq: int, data: dict[str, Any]) -> str:
    """One event of a stream, as the `sequence_number`-th."""
    payload = {"type": kind, "sequence_number": seq, **data}
    return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def replayed(response: dict[str, Any], after: int = -1) -> list[str]:
    """A kept response's stream again (`GET /v1/responses/{id}?stream=true`), the events
    after sequence number `after`: as `ResponseOutput.events` sent them, each text and
    each call's arguments in one delta."""
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    start["incomplete_details"] = None
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": start}),
        ("response.in_progress", {"response": start}),
    ]
    for index, item in enumerate(response["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            added = {**item, "arguments": "", "status": "in_progress"}
            events.append(("response.output_item.added", {"output_index": index, "item": added}))
            if item["arguments"]:
                delta = {**at, "delta": item["arguments"]}
                events.append(("response.function_call_arguments.delta", delta))
        else:
            empty = _emptied(item)
            events.append(("response.output_item.added", {"output_index": index, "item": empty}))
            part = {**at, "content_index": 0, "part": empty["content"][0]}
            events.append(("response.content_part.added", part))
            text = item["content"][0]
            message = item["type"] == "message"
            extra = {"logprobs": text.get("logprobs", [])} if message else {}
            kind = "response.output_text.delta" if message else "response.reasoning_text.delta"
            if text["text"]:
                events.append((kind, {**at, "content_index": 0, "delta": text["text"], **extra}))
        events += _item_done(item, index)
    events.append((f"response.{response['status']}", {"response": response}))
    return [_event(kind, seq, data) for seq, (kind, data) in enumerate(events) if seq > after]


def _emptied(item: dict[str, Any]) -> dict[str, Any]:
    """An item as first announced: its text not yet there."""
    part = {**item["content"][0], "text": ""}
    if "logprobs" in part:
        part["logprobs"] = []
    return {**item, "content": [part], **({"status": "in_progress"} if "status" in item else {})}


def _item_done(item: dict[str, Any], index: int) -> list[tuple]:
    """The events that close an item: its text done, its part done, the item done."""
    if item["type"] == "function_call":
        return [
            (
                "response.function_call_arguments.done",
                {
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": item["arguments"],
                },
            ),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]
    part = item["content"][0]
    done = (
        "response.output_text.done"
        if item["type"] == "message"
        else ("response.reasoning_text.done")
    )
    ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
    extra = {"logprobs": part.get("logprobs", [])} if item["type"] == "message" else {}
    return [
        (done, {**ids, "text": part["text"], **extra}),
        ("response.content_part.done", {**ids, "part": part}),
        ("response.output_item.done", {"output_index": index, "item": item}),
    ]
