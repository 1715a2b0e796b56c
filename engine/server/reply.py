"""A reply's streamed text -> what the API returns: stop strings cut, thinking apart from the
answer, tool calls parsed.

Qwen3.5 thinks between `<think>` and `</think>`; with thinking on, the chat template opens
the block in the prompt, so the reply starts inside it. A tool call is a block

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

(Qwen3.5's form; each VALUE as the template writes it: strings raw, other JSON values as
JSON), or, as Qwen2.5/Qwen3 templates ask, `<tool_call>\\n{"name": ..., "arguments": ...}
\\n</tool_call>`: both are read. Text that might be the start of a marker or a stop string is
held back until the next text decides, so nothing is sent and then taken back.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine.server.schema import json_type, resolve, value_types
from engine.tokenizer import THINK_CLOSE, THINK_OPEN

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def partial_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest end of `text` that begins one of `markers` (but is not whole)."""
    best = 0
    for marker in markers:
        for k in range(min(len(text), len(marker) - 1), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


def prompt_opens_thinking(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a `<think>` block open (the reply starts in it)."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


class StopFilter:
    """Cuts the text at the first stop string; `hit` tells that one was found, `which`
    which one."""

    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hit = False
        self.which: str | None = None
        self._held = ""

    def feed(self, text: str) -> str:
        if self.hit:
            return ""
        text = self._held + text
        found = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if found:
            at, self.which = min(found)
            self.hit, self._held = True, ""
            return text[:at]
        keep = partial_suffix(text, self.stops)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as the OpenAI API sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def arguments_object(self) -> dict[str, Any]:
        """The arguments as an object, as the Messages and Ollama APIs give them ({} where
        they do not parse as one)."""
        try:
            value = json.loads(self.arguments)
        except json.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}

    def as_dict(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


def parse_tool_call(block: str, schemas: dict[str, dict] | None = None) -> ToolCall | None:
    """One `<tool_call>...</tool_call>` block (tags included or not), or None if unreadable."""
    inner = block.strip()
    if inner.startswith(CALL_OPEN):
        inner = inner[len(CALL_OPEN) :]
    if inner.endswith(CALL_CLOSE):
        inner = inner[: -len(CALL_CLOSE)]
    inner = inner.strip()
    match = _FUNCTION.fullmatch(inner)
    if match:
        name = match.group(1).strip()
        params = (schemas or {}).get(name) or {}
        props = resolve(params, params).get("properties") or {}
        args = {}
        for key, raw in _PARAMETER.findall(match.group(2)):
            key = key.strip()
            args[key] = _argument(_trim_newline(raw), props.get(key), params)
        return ToolCall(name, json.dumps(args, ensure_ascii=False))
    try:
        obj = json.loads(inner)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text)


def _trim_newline(raw: str) -> str:
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def _argument(raw: str, schema: Any, params: Any = None) -> Any:
    """A parameter's value from its text: raw where the parameter takes only strings (or
    its schema does not say), else the JSON value it reads as (the template writes
    Python's True/False/None for those) where the schema takes that type, `$ref`s and
    unions (pydantic's `Optional`, nested models) followed within `params`; the raw text
    where it takes strings too and the text is no value of another type it takes."""
    types = value_types(schema, params)
    if types is None or types <= {"string"}:
        return raw
    text = {"True": "true", "False": "false", "None": "null"}.get(raw.strip(), raw)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return raw
    kind = json_type(value)
    if kind in types or (kind == "integer" and "number" in types) or "string" not in types:
        return value
    return raw


@dataclass(frozen=True)
class Piece:
    """One part of a reply: kind "reasoning" or "content" with `text`, or "tool_call"."""

    kind: str
    text: str = ""
    call: ToolCall | None = None


class ReplySplitter:
    """Feeds on the reply's text; returns the pieces that are certain so far.

    `thinking`: the reply starts inside a `<think>` block. `tools`: parse tool calls (the
    request offered tools); `schemas` give their parameters (JSON schemas, by tool name).
    `one_call`: the client takes one call a reply (`parallel_tool_calls: false`): the reply
    ends at its first (Generation.pieces). `lead`: the reply's leading newlines are dropped
    (not where it goes on from words already said: Anthropic's prefill).
    """

    def __init__(
        self,
        thinking: bool,
        tools: bool = False,
        schemas: dict[str, dict] | None = None,
        one_call: bool = False,
        lead: bool = True,
    ) -> None:
        self.mode = "reasoning" if thinking else "content"
        self.tools, self.schemas, self.one_call = tools, schemas or {}, one_call
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._lead = lead  # at the start of a section: leading newlines are dropped
        self._said = False  # some content (not only thinking) went out

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Piece]:
        """The rest, at the end of the reply (an unclosed block is returned as it is)."""
        out: list[Piece] = []
        while self._step(out, final=True):
            pass
        if self.mode == "tool" and self._buf:
            call = parse_tool_call(self._buf, self.schemas)
            if call is not None:
                self.calls.append(call)
                out.append(Piece("tool_call", call=call))
            else:
                self._emit(out, "content", self._buf)
        elif self._buf.strip():
            self._emit(out, self.mode, self._buf.rstrip())
        self._buf = ""
        return out

    def _step(self, out: list[Piece], final: bool) -> bool:
        """Handle the buffer up to the next marker; True when another step may follow."""
        buf = self._buf
        if self.mode == "tool":
            end = buf.find(CALL_CLOSE)
            if end < 0:
                return False
            block, self._buf = buf[: end + len(CALL_CLOSE)], buf[end + len(CALL_CLOSE) :]
            call = parse_tool_call(block, self.schemas)
            if call is None:
                self._emit(out, "content", block)
            else:
                self.calls.append(call)
                out.append(Piece("tool_call", call=call))
            self.mode, self._lead = "content", True
            return True
        markers = self._markers()
        hits = [(i, m) for m in markers if (i := buf.find(m)) >= 0]
        if hits:
            i, marker = min(hits)
            self._emit(out, self.mode, buf[:i].rstrip())
            if marker == CALL_OPEN:
                self.mode, self._buf = "tool", buf[i:]
            else:
                rest = buf[i + len(marker) :]
                self.mode = "content" if marker == THINK_CLOSE else "reasoning"
                self._buf, self._lead = rest, True
            return True
        if final:
            return False
        # Keep what may start a marker, and trailing whitespace (dropped if a marker or the
        # end follows it).
        keep = partial_suffix(buf, markers)
        body = buf[: len(buf) - keep]
        settled = body.rstrip()
        self._emit(out, self.mode, settled)
        self._buf = buf[len(settled) :]
        return False

    def _markers(self) -> list[str]:
        if self.mode == "reasoning":
            return [THINK_CLOSE]
        markers = [CALL_OPEN] if self.tools else []
        if not self._said:  # a reply may open its own thinking block, first thing
            markers.append(THINK_OPEN)
        return markers

    def _emit(self, out: list[Piece], kind: str, text: str) -> None:
        if self._lead:
            text = text.lstrip("\n")
        if not text:
            return
        self._lead = False
        if kind == "content":
            self._said = True
        out.append(Piece(kind, text))
