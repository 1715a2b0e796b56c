"""Anthropic's Messages API (`POST /v1/messages`): a request read as the chat request it
stands for (the same checks, chat template, grammar, reply splitting and scheduler); the
routes and the reply's content blocks are messages_api.py's.

As in Anthropic's API, the model thinks only when `thinking` is enabled; tools are
`{name, description, input_schema}`; a tool's results come back as `tool_result` blocks of
a user message; `output_config.format` holds the answer to a JSON schema; a `system`
message may come mid-conversation; a final assistant message is the reply's start, which
it goes on from (prefill). Errors have Anthropic's shape and name the Messages field. The
server holds no conversation between requests: a `thread` is refused with the error code
Anthropic's SDK reads to send the whole conversation instead (its tool runner asks for one).

Coding agents (Claude Code, the Agent SDK) send Claude's model names, a per-request
attribution line first in `system`, and images among tool results: the first are served
by the loaded model, the line is left out (it would change the prompt's first tokens on
every request, so no prompt could be restored from the engine's cache), and an image the
model cannot see is said in words where it does not come with the request's new message.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from engine.attachments import Attachment, AttachmentRefused, compose, file_text, sent_file
from engine.server.protocol import ApiError, bad, field, renamed

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    503: "overloaded_error",
}
# Claude Code's attribution line ("x-anthropic-billing-header: cc_version=2.1.42.834;
# cc_entrypoint=cli; cch=65abc;"), first in `system`: its values change every request.
ATTRIBUTION = re.compile(r"\Ax-anthropic-billing-header:(\s*[\w.-]+=[^;\n]*;)*\s*")
# What the model reads in place of an image it cannot see.
NO_IMAGE = "[an image ({}) was here; the model reads text only and cannot see it]"
# Anthropic's error codes its SDK reads from `error.details.error_code` to recover: a
# `thread` refused, it sends the whole conversation again, without one.
DETAILED = ("thread_unsupported_request",)
# The blocks only one role's messages carry, and that role.
OWNER = {
    "tool_use": "an assistant",
    "thinking": "an assistant",
    "tool_result": "a user",
    "image": "a user",
    "document": "a user",
}
THINKING = ("enabled", "adaptive", "between_tools")  # `thinking.type`s that let it think
_TOO_LONG = re.compile(r"the prompt has (\d+) tokens but the model's context is (\d+) tokens")


def request_id() -> str:
    """An id for one request's response (`request-id`), as Anthropic's API gives each."""
    return f"req_{uuid.uuid4().hex}"


def error_body(exc: ApiError, request_id: str | None = None) -> dict[str, Any]:
    """An error in Anthropic's shape (with the id of the request it answers)."""
    kind = ERROR_TYPES.get(exc.status, "api_error")
    body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": exc.message}}
    if exc.code in DETAILED:
        body["error"]["details"] = {"error_code": exc.code}
    if request_id is not None:
        body["request_id"] = request_id
    return body


def served_name(model: Any) -> bool:
    """Whether a request's `model` is one of Claude's: Anthropic's clients name those by
    default (Claude Code's subagents and background requests among them), and the one
    model loaded here answers them."""
    return isinstance(model, str) and model.startswith("claude-")


class MessagesRequest:
    """A Messages body read as a chat body (`chat`), with where each chat message came from
    (`origin`), so that an error about `messages[i]` names the Messages field."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.origin: list[str] = []
        self.prefill = ""  # a final assistant message's text: the reply goes on from it
        # `max_tokens: 0`, as that API pre-warms its prompt cache: the prompt read into the
        # engine's, one token drawn (the prompt's state is kept once one is) and left out.
        limit = body.get("max_tokens")
        self.prompt_only = type(limit) is int and limit == 0
        self.chat = self._chat_body()

    def _chat_body(self) -> dict[str, Any]:
        body = self.body
        if body.get("thread") is not None:
            raise ApiError(
                400,
                "'thread' asks the server to hold the conversation between requests, which "
                "this server does not: send the whole conversation in 'messages', without "
                "'thread' (the SDK's tool runner does so on this error)",
                param="thread",
                code="thread_unsupported_request",
            )
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system:
            text = _system_text(system, "system")
            if text:
                messages.append({"role": "system", "content": text})
                self.origin.append("system")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise bad("'messages' must be a non-empty list of messages", "messages")
        for i, message in enumerate(raw):
            where = f"messages[{i}]"
            role = message.get("role") if isinstance(message, dict) else None
            if role not in ("user", "assistant", "system"):
                raise bad(f"'{where}.role' must be user, assistant or system", f"{where}.role")
            for out in _message(message, where, last=i == len(raw) - 1):
                messages.append(out)
                self.origin.append(where)
        end = messages[-1] if len(messages) > 1 else {}
        if raw[-1].get("role") == "assistant" and end.get("content") and "tool_calls" not in end:
            self.prefill = messages.pop()["content"]
            self.origin.pop()
        chat: dict[str, Any] = {"messages": messages}
        for name in ("model", "temperature", "top_p", "top_k", "stream", "max_tokens"):
            if body.get(name) is not None:
                chat[name] = body[name]
        if self.prompt_only:
            chat["max_tokens"] = 1
        if served_name(chat.get("model")):
            del chat["model"]  # the loaded model answers, and the reply names it
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
        schema = _output_schema(body)
        if schema is not None:
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema},
            }
        thinking = field(body, "thinking", "object", {})
        # "adaptive": the model decides whether to think; Qwen3.5 thinks unless told not to.
        kind = field(thinking, "type", "string", None, "thinking.") if thinking else "disabled"
        if kind not in (*THINKING, "disabled"):  # a typo would turn thinking off unsaid
            raise bad(
                "'thinking.type' must be enabled, disabled, adaptive or between_tools, got "
                f"{json.dumps(kind)}",
                "thinking.type",
            )
        # A reply that goes on from its first words does not think first (nor in that API).
        chat["chat_template_kwargs"] = {"enable_thinking": kind in THINKING and not self.prefill}
        budget = field(thinking, "budget_tokens", "integer", 0, "thinking.")
        if kind == "enabled" and budget:  # the thinking stops there (engine/thinking_budget.py)
            chat["thinking_budget"] = budget
        return chat

    def rename(self, exc: ApiError) -> ApiError:
        """`exc` with the chat request's `messages[i]` put back as the Messages field it came
        from (the system prompt, or the message of that index), `stop` as `stop_sequences`,
        the format's schema as `output_config.format.schema`; a prompt longer than the
        context said as Anthropic's API says it ("prompt is too long: N tokens > M
        maximum"), which agents read to compact their conversation."""
        words = {
            r"'stop'": "'stop_sequences'",
            r"^stop$": "stop_sequences",
            r"response_format\.json_schema\.schema": "output_config.format.schema",
            r"'thinking_budget'": "'thinking.budget_tokens'",
            r"^thinking_budget$": "thinking.budget_tokens",
        }
        out = renamed(exc, self.origin, words)
        too_long = _TOO_LONG.search(out.message)
        if out.code == "context_length_exceeded" and too_long:
            prompt, context = (int(n) for n in too_long.groups())
            message = (
                f"prompt is too long: {prompt} tokens > {context - 1} maximum (the model's "
                f"context is {context} tokens, shared by prompt and reply); shorten the "
                "conversation, or restart the server with a larger --context"
            )
            out = ApiError(out.status, message, out.kind, out.param, out.code)
        return out


def _system_text(system: Any, where: str) -> str:
    """The system prompt's text: a string, or its text blocks joined, without the
    attribution line Claude Code puts first (ATTRIBUTION)."""
    if isinstance(system, str):
        return ATTRIBUTION.sub("", system)
    if not isinstance(system, list):
        raise bad(f"'{where}' must be a string or a list of text blocks", where)
    texts = [_text_block(block, f"{where}[{j}]") for j, block in enumerate(system)]
    return "".join(ATTRIBUTION.sub("", text) for text in texts)


def _text_block(block: Any, at: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise bad(f"'{at}' is a '{kind}' block: this field takes text blocks only", at)
    return field(block, "text", "string", "", f"{at}.")


def _no_image(block: dict[str, Any]) -> str:
    source = block.get("source")
    kind = source.get("media_type") if isinstance(source, dict) else None
    return NO_IMAGE.format(kind if isinstance(kind, str) else "image")


def _result_text(content: Any, at: str) -> str:
    """A tool result's content as the text the model reads: a string, or its text blocks
    joined, after any documents (engine/attachments.py); an image is said in words (the
    tool's result stays in the conversation: refusing it would refuse every later turn)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{at}' must be a string or a list of blocks", at)
    texts, documents = [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "image":
            texts.append(_no_image(block))
        elif kind == "document":
            documents.append(_document(block, f"{at}[{j}]"))
        else:
            texts.append(_text_block(block, f"{at}[{j}]"))
    return compose("".join(texts), documents)


def _message(message: dict[str, Any], where: str, last: bool) -> list[dict[str, Any]]:
    """One Messages message as chat messages: a user's tool results become tool messages
    (first, as the API orders them), an assistant's tool_use blocks its tool calls and its
    thinking blocks its reasoning; a system message stays one (system_first puts one that
    comes later in as a user turn). An image in the request's last message is refused: the
    model cannot see it, and the client should say so; one earlier is said in words."""
    role, content = message["role"], message.get("content", "")
    if role == "system":
        text = _system_text(content, f"{where}.content")
        return [{"role": "system", "content": text}] if text else []
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
        elif kind == "image" and role == "user" and last:
            raise bad(
                f"'{at}' is an image: the model served here reads text only; send what the "
                "image shows as text",
                at,
            )
        elif kind == "image" and role == "user":
            texts.append(_no_image(block))
        elif kind == "document" and role == "user":
            documents.append(_document(block, at))
        elif kind == "thinking" and role == "assistant":
            thinking.append(field(block, "thinking", "string", "", f"{at}."))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use" and role == "assistant":
            args = field(block, "input", "object", {}, f"{at}.")
            calls.append(
                {
                    "id": field(block, "id", "string", "", f"{at}."),
                    "type": "function",
                    "function": {
                        "name": _name(block, at),
                        "arguments": json.dumps(args, ensure_ascii=False),
                    },
                }
            )
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = _result_text(result, f"{at}.content") if result else ""
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(
                {
                    "role": "tool",
                    "content": text,
                    "tool_call_id": field(block, "tool_use_id", "string", "", f"{at}."),
                }
            )
        elif kind in OWNER:
            raise bad(f"'{at}' is a '{kind}' block, which only {OWNER[kind]} message carries", at)
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
            return Attachment(name, _result_text(source.get("content", ""), f"{at}.source.content"))
    except AttachmentRefused as exc:
        raise bad(f"'{at}': {exc}", at) from None
    raise bad(
        f"'{at}.source' is of type {json.dumps(kind)}: this server fetches nothing and keeps "
        "no files; send the document as 'base64' or 'text'",
        f"{at}.source",
    )


def _output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema the answer is held to: `output_config.format` (or the earlier
    `output_format`), `{"type": "json_schema", "schema": {...}}`; None where there is none."""
    config = field(body, "output_config", "object", {})
    where = "output_config.format"
    fmt = field(config, "format", "object", None, "output_config.")
    if fmt is None:
        where, fmt = "output_format", field(body, "output_format", "object", None)
    if fmt is None:
        return None
    if fmt.get("type") != "json_schema":
        raise bad(f"'{where}.type' must be json_schema", f"{where}.type")
    schema = field(fmt, "schema", "object", None, f"{where}.")
    if schema is None:
        raise bad(f"'{where}.schema' must be a JSON schema object", f"{where}.schema")
    return schema


def _tool(tool: Any, i: int) -> dict[str, Any]:
    """A Messages tool ({name, description, input_schema}) as chat's function tool."""
    if not isinstance(tool, dict) or "input_schema" not in tool:
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise bad(
            f"'tools[{i}]' ('{kind}') is not a client tool with an input_schema: this "
            "server runs client tools only",
            f"tools[{i}]",
        )
    where = f"tools[{i}]"
    schema = field(tool, "input_schema", "object", None, f"{where}.")
    fn = {"name": _name(tool, where), "parameters": schema}
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
        return {"type": "function", "function": {"name": _name(choice, "tool_choice")}}
    raise bad("'tool_choice.type' must be auto, any, tool or none", "tool_choice.type")


def _name(block: dict[str, Any], at: str) -> str:
    """The tool named at `at` (a tool, a tool_use block, a forced tool_choice)."""
    name = block.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"'{at}.name' must be a non-empty string, the tool's name", f"{at}.name")
    return name
