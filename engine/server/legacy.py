"""OpenAI's older function calling, as clients written before `tools` still send it:
`functions` and `function_call` in the request, assistant messages holding a
`function_call` and `function` messages with its result. Read as the tools request it stands
for; the reply then gives its call as `message.function_call` (streamed as
`delta.function_call`) with the finish reason "function_call", as that API did."""

from __future__ import annotations

from typing import Any

from engine.server.protocol import bad, field


def read_legacy(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the body in the `tools` shape, whether it asked in the `functions` one)."""
    functions = field(body, "functions", "array")
    choice = body.get("function_call")
    if functions is None and choice is None and not _has_legacy_messages(body):
        return body, False
    if functions is not None and (body.get("tools") or body.get("tool_choice") is not None):
        raise bad("send either 'functions' (the older form) or 'tools', not both", "functions")
    out = {k: v for k, v in body.items() if k not in ("functions", "function_call")}
    if functions is not None:
        out["tools"] = [_tool(f, i) for i, f in enumerate(functions)]
        if choice is not None:
            out["tool_choice"] = _choice(choice)
    elif choice is not None:
        raise bad("'function_call' needs the 'functions' it chooses from", "function_call")
    if isinstance(body.get("messages"), list):
        out["messages"] = _messages(body["messages"])
    return out, functions is not None


def _has_legacy_messages(body: dict[str, Any]) -> bool:
    messages = body.get("messages")
    return isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "function" or m.get("function_call"))
        for m in messages
    )


def _tool(function: Any, i: int) -> dict[str, Any]:
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad(f"'functions[{i}]' must be an object with a 'name'", f"functions[{i}]")
    return {"type": "function", "function": function}


def _choice(choice: Any) -> Any:
    if choice in ("auto", "none"):
        return choice
    if isinstance(choice, dict) and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad("'function_call' must be 'auto', 'none' or {\"name\": ...}", "function_call")


def _messages(messages: list[Any]) -> list[Any]:
    """Each assistant `function_call` as a tool call with an id, each `function` message as
    the tool message answering the last call of that name."""
    out: list[Any] = []
    ids: dict[str, str] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            out.append(message)  # read_chat names what is wrong with it
            continue
        call = message.get("function_call")
        if message.get("role") == "assistant" and call is not None:
            if not isinstance(call, dict):
                raise bad(f"'messages[{i}].function_call' must be an object",
                          f"messages[{i}].function_call")  # fmt: skip
            call_id = f"call_{i}"
            ids[str(call.get("name"))] = call_id
            rest = {k: v for k, v in message.items() if k != "function_call"}
            tool_call = {"id": call_id, "type": "function", "function": call}
            out.append({**rest, "tool_calls": [*(rest.get("tool_calls") or []), tool_call]})
        elif message.get("role") == "function":
            name = field(message, "name", "string", None, f"messages[{i}].")
            if name is None:
                raise bad(f"'messages[{i}].name' must name the function whose result it is",
                          f"messages[{i}].name")  # fmt: skip
            call_id = ids.get(name, f"call_{i}")
            out.append({**message, "role": "tool", "tool_call_id": call_id})
        else:
            out.append(message)
    return out


def as_function_call(message: dict[str, Any]) -> dict[str, Any]:
    """A reply's message with its first tool call as `function_call` (the older API held
    one call a reply)."""
    calls = message.pop("tool_calls", None)
    if calls:
        message["function_call"] = calls[0]["function"]
    return message


def finish(reason: str) -> str:
    return "function_call" if reason == "tool_calls" else reason
