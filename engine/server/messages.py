"""Anthropic's Messages API (`POST /v1/messages`), as the `anthropic` client and the coding
agents built on it send it (they authenticate with `x-api-key`). A request is read as the
chat request it stands for (the same checks, chat template, grammar, reply splitting and
scheduler); the reply's pieces become content blocks: `thinking`, `text`, `tool_use`.

As in Anthropic's API, the model thinks only when `thinking` is enabled; tools are
`{name, description, input_schema}`; a tool's results come back as `tool_result` blocks of
a user message. Errors have Anthropic's shape and name the Messages field.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from engine.attachments import Attachment, AttachmentRefused, compose, file_text, sent_file
from engine.server.generation import Generation
from engine.server.protocol import ApiError, bad, field, renamed, streamed_error
from engine.server.reply import Piece

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    503: "overloaded_error",
}


def error_body(exc: ApiError) -> dict[str, Any]:
    """An error in Anthropic's shape."""
    kind = ERROR_TYPES.get(exc.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


class MessagesRequest:
    """A Messages body read as a chat body (`chat`), with where each chat message came from
    (`origin`), so that an error about `messages[i]` names the Messages field."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.origin: list[str] = []
        self.chat = self._chat_body()

    def _chat_body(self) -> dict[str, Any]:
        body = self.body
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system:
            text = system if isinstance(system, str) else _texts(system, "system")
            messages.append({"role": "system", "content": text})
            self.origin.append("system")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad("'messages' must be a non-empty list of messages", "messages")
        for i, message in enumerate(raw):
            where = f"messages[{i}]"
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise bad(f"'{where}.role' must be user or assistant", f"{where}.role")
            for out in _message(message, where):
                messages.append(out)
                self.origin.append(where)
        chat: dict[str, Any] = {"messages": messages}
        for name in ("model", "temperature", "top_p", "top_k", "stream", "max_tokens"):
            if body.get(name) is not None:
                chat[name] = body[name]
        if body.get("stop_sequences"):
            chat["stop"] = body["stop_sequences"]
        tools = field(body, "tools", "array")
        if tools:
            chat["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
        choice = field(body, "tool_choice", "object")
        if choice is not None:
            chat["tool_choice"] = _tool_choice(choice)
            parallel = field(choice, "disable_parallel_tool_use", "boolean", False, "tool_choice.")
            chat["parallel_tool_calls"] = not parallel
        thinking = field(body, "thinking", "object", {})
        # "adaptive": the model decides whether to think; Qwen3.5 thinks unless told not to.
        kind = field(thinking, "type", "string", "disabled", "thinking.")
        enabled = kind in ("enabled", "adaptive")
        chat["chat_template_kwargs"] = {"enable_thinking": enabled}
        return chat

    def rename(self, exc: ApiError) -> ApiError:
        """`exc` with the chat request's `messages[i]` put back as the Messages field it came
        from (the system prompt, or the message of that index), and `stop` as
        `stop_sequences`."""
        return renamed(
            exc, self.origin, {r"'stop'": "'stop_sequences'", r"^stop$": "stop_sequences"}
        )


def _texts(blocks: Any, where: str) -> str:
    """Text blocks joined (a system prompt, a tool result); any other block refused by name."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad(f"'{where}' must be a string or a list of text blocks", where)
    out = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise bad(
                f"'{where}[{j}]' is a '{kind}' block: this server takes text only", f"{where}[{j}]"
            )
        out.append(field(block, "text", "string", "", f"{where}[{j}]."))
    return "".join(out)


def _message(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """One Messages message as chat messages: a user's tool results become tool messages
    (first, as the API orders them), an assistant's tool_use blocks its tool calls and its
    thinking blocks its reasoning."""
    role, content = message["role"], message.get("content", "")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad(f"'{where}.content' must be a string or a list of blocks", f"{where}.content")
    texts, calls, results, thinking, documents = [], [], [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(field(block, "text", "string", "", f"{at}."))
        elif kind == "document" and role == "user":
            documents.append(_document(block, at))
        elif kind == "thinking" and role == "assistant":
            thinking.append(field(block, "thinking", "string", "", f"{at}."))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use" and role == "assistant":
            args = block.get("input", {})
            calls.append(
                {
                    "id": field(block, "id", "string", "", f"{at}."),
                    "type": "function",
                    "function": {
                        "name": field(block, "name", "string", None, f"{at}."),
                        "arguments": json.dumps(args, ensure_ascii=False),
                    },
                }
            )
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = _texts(result, f"{at}.content") if result else ""
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(
                {
                    "role": "tool",
                    "content": text,
                    "tool_call_id": field(block, "tool_use_id", "string", "", f"{at}."),
                }
            )
        else:
            name = kind if isinstance(kind, str) else type(block).__name__
            raise bad(
                f"'{at}' is a '{name}' block: this server takes text, document (text or "
                "PDF), thinking, tool_use and tool_result blocks",
                at,
            )
    out = list(results)
    if texts or calls or documents or not results:
        msg: dict[str, Any] = {"role": role, "content": compose("".join(texts), documents)}
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["reasoning_content"] = "".join(thinking)
        out.append(msg)
    return out


def _document(block: dict[str, Any], at: str) -> Attachment:
    """A document block (a PDF or text in base64, or plain text) as a file attached to the
    message (engine/attachments.py); one behind a URL or a file id is refused by name."""
    source = field(block, "source", "object", {}, f"{at}.")
    kind = source.get("type")
    pdf = source.get("media_type") == "application/pdf"
    name = field(block, "title", "string", "", f"{at}.") or ("document.pdf" if pdf else "document")
    try:
        if kind == "base64":
            return sent_file(name, field(source, "data", "string", "", f"{at}.source."))
        if kind == "text":
            text = field(source, "data", "string", "", f"{at}.source.")
            return Attachment(name, file_text(name, text.encode("utf-8")))
        if kind == "content":
            return Attachment(name, _texts(source.get("content", ""), f"{at}.source.content"))
    except AttachmentRefused as exc:
        raise bad(f"'{at}': {exc}", at) from None
    raise bad(
        f"'{at}.source' is of type {json.dumps(kind)}: this server fetches nothing and keeps "
        "no files; send the document as 'base64' or 'text'",
        f"{at}.source",
    )


def _tool(tool: Any, i: int) -> dict[str, Any]:
    """A Messages tool ({name, description, input_schema}) as chat's function tool."""
    if not isinstance(tool, dict) or "input_schema" not in tool:
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise bad(
            f"'tools[{i}]' ('{kind}') is not a client tool with an input_schema: this "
            "server runs client tools only",
            f"tools[{i}]",
        )
    fn = {"name": tool.get("name"), "parameters": tool["input_schema"]}
    if tool.get("description"):
        fn["description"] = tool["description"]
    return {"type": "function", "function": fn}


def _tool_choice(choice: dict[str, Any]) -> Any:
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise bad("'tool_choice.type' must be auto, any, tool or none", "tool_choice.type")


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


class MessageOutput:
    """One reply's content blocks, built from its pieces (`add`), and the message object."""

    def __init__(self, model: str) -> None:
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.blocks: list[dict[str, Any]] = []

    def add(self, piece: Piece) -> tuple[dict[str, Any], bool]:
        """Take one piece; (the block it went to, whether that block is new)."""
        if piece.kind == "tool_call":
            call = piece.call
            assert call is not None
            args = call.arguments_object()
            block = {
                "type": "tool_use",
                "id": f"toolu_{call.id.removeprefix('call_')}",
                "name": call.name,
                "input": args,
            }
            self.blocks.append(block)
            return block, True
        kind, key = ("thinking", "thinking") if piece.kind == "reasoning" else ("text", "text")
        if self.blocks and self.blocks[-1]["type"] == kind:
            self.blocks[-1][key] += piece.text
            return self.blocks[-1], False
        block = {"type": kind, key: piece.text}
        if kind == "thinking":
            block["signature"] = ""
        self.blocks.append(block)
        return block, True

    def stop(self, gen: Generation) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) as the API gives them."""
        if gen.finish_reason == "length":
            return "max_tokens", None
        if any(b["type"] == "tool_use" for b in self.blocks):
            return "tool_use", None
        if gen.stop.hit:
            return "stop_sequence", gen.stop.which
        return "end_turn", None

    def message(self, gen: Generation) -> dict[str, Any]:
        reason, sequence = self.stop(gen)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _usage(gen),
        }

    async def events(self, gen: Generation) -> AsyncIterator[str]:
        """The stream: message_start, each block's start / deltas / stop, message_delta
        with the stop reason and usage, message_stop."""

        def event(kind: str, **data: Any) -> str:
            payload = {"type": kind, **data}
            return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

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
            async for piece in gen.pieces():
                if piece.kind != "tool_call" and not piece.text:
                    continue
                block, new = self.add(piece)
                index = len(self.blocks) - 1
                if new:
                    if index > 0:
                        yield event("content_block_stop", index=index - 1)
                    start = (
                        {**block, "input": {}}
                        if block["type"] == "tool_use"
                        else ({**block, block["type"]: ""})
                    )
                    yield event("content_block_start", index=index, content_block=start)
                if block["type"] == "tool_use":
                    delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                elif block["type"] == "thinking":
                    delta = {"type": "thinking_delta", "thinking": piece.text}
                else:
                    delta = {"type": "text_delta", "text": piece.text}
                yield event("content_block_delta", index=index, delta=delta)
            if self.blocks:
                yield event("content_block_stop", index=len(self.blocks) - 1)
            reason, sequence = self.stop(gen)
            yield event(
                "message_delta",
                delta={"stop_reason": reason, "stop_sequence": sequence},
                usage=_usage(gen),
            )
            yield event("message_stop")
        except Exception as exc:  # after the head went out: an error event
            yield event("error", error=error_body(streamed_error(exc))["error"])
