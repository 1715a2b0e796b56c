"""A chat request's body -> ChatRequest: the messages as the chat template reads them (text
parts joined, files sent inline read as attachments, earlier calls in the template's form),
the tools, and a forced `tool_choice` as the grammar of one call (engine.constraint). Errors
name the field, as protocol.py's readers do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from engine.attachments import Attachment, AttachmentRefused, compose, sent_file
from engine.constraint import tool_call_grammar
from engine.errors import RequestRefused
from engine.server.protocol import Options, bad, field, read_options
from engine.server.schema import RecursiveSchema, has_refs, inline_refs

ROLES = ("system", "developer", "user", "assistant", "tool")
TEXT_PARTS = ("text", "input_text", "output_text")


@dataclass(frozen=True)
class ChatRequest:
    options: Options
    messages: list[dict[str, Any]]  # as the chat template reads them
    tools: list[dict[str, Any]] | None
    enable_thinking: bool | None
    one_call: bool = False  # `parallel_tool_calls: false`: the reply ends at its first call
    thinking_budget: int = 0  # the most tokens the reply thinks (0: no limit)
    no_calls: bool = False  # `tool_choice: "none"`: the tools are offered, no call is read

    @property
    def reads_calls(self) -> bool:
        """Whether the reply's tool calls are parsed (tools offered, `tool_choice` not
        "none")."""
        return bool(self.tools) and not self.no_calls


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
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        tools, choice = _allowed_tools(choice, tools)
    # "none": the model is not to call a tool. The tools stay in the prompt, as OpenAI's
    # and Anthropic's APIs keep them (the conversation's calls refer to them, and the
    # prompt goes on from the turns before: the prompt cache reuses it), and nothing the
    # model writes is read as a call (vLLM's reading): a call written anyway is text.
    if choice not in ("auto", "none", None):
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
    return ChatRequest(options, messages, tools, thinking, one_call, budget, choice == "none")


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


def _allowed_tools(
    choice: dict[str, Any], tools: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]] | None, str]:
    """`tool_choice` {"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}: (the
    request's tools it names, the only ones the model is offered; its mode, "auto" or
    "required", as the tool_choice over them)."""
    spec = field(choice, "allowed_tools", "object", {}, "tool_choice.")
    mode = field(spec, "mode", "string", "auto", "tool_choice.allowed_tools.")
    named = field(spec, "tools", "array", [], "tool_choice.allowed_tools.")
    names = set()
    for tool in named:
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise bad("'tool_choice.allowed_tools.tools' must be a list of "
                      '{"type": "function", "function": {"name": ...}}', "tool_choice")  # fmt: skip
        names.add(name)
    if mode not in ("auto", "required"):
        raise bad(f"'tool_choice.allowed_tools.mode' = {json.dumps(mode)[:40]}: use auto or "
                  "required", "tool_choice")  # fmt: skip
    offered = {t["function"]["name"] for t in tools or ()}
    missing = sorted(names - offered)
    if missing or not names:
        what = f"names {missing[0]!r}, which is not in 'tools'" if missing else "names no tool"
        raise bad(f"'tool_choice' of type allowed_tools {what}", "tool_choice")
    return [t for t in tools or () if t["function"]["name"] in names], mode


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
                "'tool_choice' must be 'auto', 'none', 'required', "
                '{"type": "function", "function": {"name": ...}} or '
                '{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}',
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
        "content": _content(message.get("content"), where, role == "assistant"),
    }
    if role == "assistant":
        refusal = message.get("refusal")  # a reply's message sent back as it came
        if not out["content"] and isinstance(refusal, str):
            out["content"] = refusal
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


def _content(content: Any, where: str, assistant: bool = False) -> str:
    """Text content: a string, or a list of parts: its text parts joined, after the files
    sent as `file` parts (text, PDF or Word, each fenced under its name: engine/attachments.py).
    An `assistant` message's `refusal` parts (an earlier reply's, sent back) are its words.
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
        elif kind == "refusal" and assistant:
            texts.append(field(part, "refusal", "string", "", f"{where}content."))
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
