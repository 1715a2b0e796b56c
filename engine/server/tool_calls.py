"""Tool calls as the model writes them -> the calls the APIs return, whole or as they are
written.

Qwen3.5 writes a call as

    <tool_call>
    <function=NAME>
    <parameter=ARG>
    VALUE
    </parameter>
    </function>
    </tool_call>

each VALUE as the template writes it: strings raw, other JSON values as JSON. `CallReader`
reads the part after `<function=NAME>` as it comes and turns it into the call's arguments, a
JSON object, in the order the model writes them: a parameter whose schema takes only strings
(or does not say) streams as its characters arrive, any other once its `</parameter>` has
come (its text may read as a number, a list, Python's True...). What it has given out is
never taken back, so the fragments joined are the call's arguments, and `parse_tool_call`
reads a whole block through the same reader. A parameter named twice keeps its first value.
As vLLM's `qwen3_coder` parser reads them, a value whose `</parameter>` the model left out
(Qwen3.5 does, in long contexts) ends where the next parameter or the function's end begins:
here only where that tag begins a line and is whole (`<parameter=NAME>` and its line break,
NAME one of the tool's parameters where its schema names them; `</function>` and then
`</tool_call>`), so that a value holding such text otherwise keeps it. A second
`<function=` in the block (another function called in the same block) ends this call: the
reader stops there (`more`) and the rest is the next call's.
No library reads this form incrementally; hence a small reader of its own.

Qwen2.5/Qwen3 templates ask for `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`
instead: that form is read whole, once its block has closed.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from engine.server.schema import json_type, resolve, value_types

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
# What may end a value: its closing tag, the block's, or where the model left its closing tag
# out, the next parameter's head or the function's end on a line of their own.
VALUE_ENDS = [PARAM_CLOSE, CALL_CLOSE, "\n" + PARAM_OPEN, "\n" + FUNCTION_CLOSE]
_FUNCTION_HEAD = re.compile(r"<function=([^>\n]+)>")


def partial_suffix(text: str, markers: list[str]) -> int:
    """Length of the longest end of `text` that begins one of `markers` (but is not whole)."""
    best = 0
    for marker in markers:
        for k in range(min(len(text), len(marker) - 1), best, -1):
            if text.endswith(marker[:k]):
                best = k
                break
    return best


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


def function_head(text: str) -> tuple[str, int] | None:
    """(NAME, where the head ends) for a `text` that starts with `<function=NAME>`."""
    match = _FUNCTION_HEAD.match(text)
    return (match.group(1).strip(), match.end()) if match else None


class CallReader:
    """The arguments of one call in Qwen3.5's form, read from the text after its
    `<function=NAME>`. `feed` returns the arguments' JSON text that became certain, `close`
    the rest where the reply ends inside the call (an open value ends there, the object is
    closed). `done` once `</tool_call>` has come; `rest` is the text after it. `call` is the
    call so far; its id stays the same to the end. `more`: the block goes on with another
    function's call, which `rest` starts with (its `<function=`)."""

    def __init__(self, name: str, schemas: dict[str, dict] | None = None) -> None:
        self.call = ToolCall(name, "")
        self.done = False
        self.more = False
        self.rest = ""
        params = (schemas or {}).get(name) or {}
        self._params = params
        self._props = resolve(params, params).get("properties") or {}
        self._buf = ""
        self._given: list[str] = []  # the arguments' text given out so far, in pieces
        self._seen: set[str] = set()  # parameter names read (a repeated one is skipped)
        self._written = 0  # parameters written into the arguments
        self._key: str | None = None  # the parameter whose value is being read
        self._raw = False  # its value is a string, streamed as it comes
        self._skip = False  # its name came before: its value is dropped
        self._fresh = False  # nothing of its value read yet (its first newline is the form's)

    @property
    def result(self) -> ToolCall:
        return ToolCall(self.call.name, "".join(self._given), self.call.id)

    def feed(self, text: str) -> str:
        self._buf += text
        out: list[str] = []
        while not self.done and self._step(out):
            pass
        return self._give(out)

    def close(self) -> str:
        out: list[str] = []
        if not self.done:
            if self._key is not None:
                value = self._buf[1:] if self._fresh and self._buf[:1] == "\n" else self._buf
                # Cut inside a closing tag (or before one was decided): the tag is not the
                # value's.
                end = self._value_end(value)
                self._end_value(out, value[: end[0] if isinstance(end, tuple) else end])
            out.append("}" if self._written else "{}")
            self.done, self._buf = True, ""
        return self._give(out)

    def _give(self, out: list[str]) -> str:
        text = "".join(out)
        self._given.append(text)
        return text

    def _step(self, out: list[str]) -> bool:
        return self._in_value(out) if self._key is not None else self._between(out)

    def _between(self, out: list[str]) -> bool:
        """Outside a value: the next parameter's head, or the call's end (the block's, or
        the next function's head); the text between them (`</function>`, line breaks) is
        not the call's."""
        buf = self._buf
        at, end, then = buf.find(PARAM_OPEN), buf.find(CALL_CLOSE), buf.find(FUNCTION_OPEN)
        ends = [(i, m) for i, m in ((end, CALL_CLOSE), (then, FUNCTION_OPEN)) if i >= 0]
        if ends and (at < 0 or min(ends)[0] < at):
            i, marker = min(ends)
            self.more = marker == FUNCTION_OPEN
            self.rest = buf[i:] if self.more else buf[i + len(CALL_CLOSE) :]
            self._buf, self.done = "", True
            out.append("}" if self._written else "{}")
            return False
        if at < 0:
            keep = partial_suffix(buf, [PARAM_OPEN, CALL_CLOSE, FUNCTION_OPEN])
            self._buf = buf[len(buf) - keep :] if keep else ""
            return False
        head_end = buf.find(">", at)
        line_end = buf.find("\n", at)
        if 0 <= line_end < head_end or (head_end < 0 and line_end >= 0):
            self._buf = buf[at + len(PARAM_OPEN) :]  # not a parameter's head: passed over
            return True
        if head_end < 0:
            self._buf = buf[at:]  # its name is still coming
            return False
        key = buf[at + len(PARAM_OPEN) : head_end].strip()
        self._buf = buf[head_end + 1 :]
        self._key, self._fresh = key, True
        self._skip = key in self._seen
        self._seen.add(key)
        types = value_types(self._props.get(key), self._params)
        self._raw = types is None or types <= {"string"}
        if self._raw and not self._skip:
            out.append(self._name(key) + '"')
        return True

    def _in_value(self, out: list[str]) -> bool:
        buf = self._buf
        if self._fresh:
            if not buf:
                return False
            buf, self._fresh = (buf[1:] if buf[0] == "\n" else buf), False
        end = self._value_end(buf)
        if isinstance(end, tuple):
            self._end_value(out, buf[: end[0]])
            self._buf = buf[end[1] :]
            return True
        if self._raw and not self._skip:
            settled = buf[:end]
            settled = settled[:-1] if settled.endswith("\n") else settled  # the form's, maybe
            out.append(_escaped(settled))
            buf = buf[len(settled) :]
        self._buf = buf
        return False

    def _value_end(self, buf: str) -> tuple[int, int] | int:
        """Where the value in `buf` ends and where reading goes on after it; where it has
        not ended yet, where the text that may still end it starts."""
        found = []
        for tag in (PARAM_CLOSE, CALL_CLOSE):  # `</tool_call>` ends the value and the call
            if (i := buf.find(tag)) >= 0:
                found.append((i, i + len(tag) if tag == PARAM_CLOSE else i))
        hold = len(buf) - partial_suffix(buf, VALUE_ENDS)
        limit = min(found)[0] if found else len(buf)
        for tag in VALUE_ENDS[2:]:  # a `</parameter>` left out
            i = buf.find(tag)
            while 0 <= i < limit:
                ends = self._left_out(buf[i + 1 :])
                if ends is None:
                    hold = min(hold, i)
                    break
                if ends:
                    found.append((i + 1, i + 1))  # the line break is the value's last
                    break
                i = buf.find(tag, i + 1)
        return min(found) if found else hold

    def _left_out(self, text: str) -> bool | None:
        """Whether `text`, a line that starts with `<parameter=` or `</function>` inside a
        value, ends the value (its `</parameter>` left out); None: not decided yet."""
        if text.startswith(FUNCTION_CLOSE):
            after = text[len(FUNCTION_CLOSE) :].lstrip()
            if after.startswith(CALL_CLOSE):
                return True
            return None if CALL_CLOSE.startswith(after) else False
        head = text[len(PARAM_OPEN) :]
        close = head.find(">")
        if close < 0:
            return False if "\n" in head or "<" in head else None
        name = head[:close]
        if "\n" in name or "<" in name or (self._props and name.strip() not in self._props):
            return False
        return None if close + 1 == len(head) else head[close + 1] == "\n"

    def _end_value(self, out: list[str], text: str) -> None:
        """The value's last text (`text`, its closing newline still on it) taken."""
        text = text[:-1] if text.endswith("\n") else text
        if self._skip:
            pass
        elif self._raw:
            out.append(_escaped(text) + '"')
        else:
            value = _argument(text, self._props.get(self._key), self._params)
            out.append(self._name(self._key) + json.dumps(value, ensure_ascii=False))  # type: ignore[arg-type]
        self._key = None

    def _name(self, key: str) -> str:
        """The JSON text before a parameter's value."""
        lead = ", " if self._written else "{"
        self._written += 1
        return f"{lead}{json.dumps(key, ensure_ascii=False)}: "


def _escaped(text: str) -> str:
    """`text` as the inside of a JSON string (escaping goes character by character, so the
    pieces of a string escaped one by one join into the whole string's escaping)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def parse_tool_call(block: str, schemas: dict[str, dict] | None = None) -> ToolCall | None:
    """One `<tool_call>...</tool_call>` block (tags included or not), or None if unreadable."""
    inner = block.strip()
    if inner.startswith(CALL_OPEN):
        inner = inner[len(CALL_OPEN) :]
    if inner.endswith(CALL_CLOSE):
        inner = inner[: -len(CALL_CLOSE)]
    inner = inner.strip()
    head = function_head(inner)
    if head is not None:
        reader = CallReader(head[0], schemas)
        reader.feed(inner[head[1] :])
        reader.close()
        return reader.result
    try:
        obj = json.loads(inner)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text)


_NAME_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_TRIES = 256  # cut points a cut call's JSON is tried at, from its end back


def cut_call(block: str) -> ToolCall | None:
    """A call in the JSON form that the reply ended inside (the token limit, a stop
    string): its arguments closed after the last value that came (a string or a number cut
    inside kept as far as it came), as a call in Qwen3.5's form cut short is closed; None
    where its name had not come whole."""
    inner = block.strip()
    inner = inner[len(CALL_OPEN) :].strip() if inner.startswith(CALL_OPEN) else inner
    name = _NAME_HEAD.match(inner)
    if name is None:
        return None
    obj = _closed_json(inner)
    args = obj.get("arguments", {}) if isinstance(obj, dict) else {}
    text = json.dumps(args if isinstance(args, dict) else {}, ensure_ascii=False)
    return ToolCall(json.loads(f'"{name.group(1)}"'), text)


def _closed_json(text: str) -> Any:
    """The JSON value `text` starts, cut short: what reads once its open strings, arrays
    and objects are closed at the latest point that gives JSON; None if none does."""
    states = [(False, "")]  # at each cut point: (inside a string, the brackets to close)
    inside, escaped, closers = False, False, ""
    for ch in text:
        if inside:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                inside = False
        elif ch == '"':
            inside = True
        elif ch in "{[":
            closers = ("}" if ch == "{" else "]") + closers
        elif ch in "}]":
            closers = closers[1:]
        states.append((inside, closers))
    for end in range(len(text), max(0, len(text) - _TRIES), -1):
        inside, closers = states[end]
        head = text[:end] + '"' if inside else text[:end].rstrip().rstrip(",")
        try:
            return json.loads(head + closers)
        except json.JSONDecodeError:
            continue
    return None


_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NONE = object()  # no value read


def _argument(raw: str, schema: Any, params: Any = None) -> Any:
    """A parameter's value from its text: raw where the parameter takes only strings (or
    its schema does not say), else the JSON value it reads as (the template writes
    Python's True/False/None for those) where the schema takes that type, `$ref`s and
    unions (pydantic's `Optional`, nested models) followed within `params`; the raw text
    where it takes strings too and the text is no value of another type it takes (a text
    in quotes included: the quotes are the string's own). Where it does not take strings, a
    text that is no JSON of its types is read loosely as vLLM's qwen3_coder parser reads it
    (`_loosely`). A number JSON cannot write (1e999, NaN) is never a value: the arguments
    stay JSON."""
    types = value_types(schema, params)
    if types is None or types <= {"string"}:
        return raw
    text = {"True": "true", "False": "false", "None": "null"}.get(raw.strip(), raw)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = _NONE
    if value is not _NONE and not _finite(value):
        value = _NONE
    kind = None if value is _NONE else json_type(value)
    if kind == "string" and "string" in types:
        return raw  # the template writes strings raw: quotes in the text are the value's
    if kind in types or (kind == "integer" and "number" in types):
        return value
    if "string" in types:
        return raw  # no value of its other types: the text is the string it takes
    loose = _loosely(raw.strip(), types)
    if loose is not _NONE:
        return loose
    return raw if value is _NONE else value


def _loosely(text: str, types: set[str]) -> Any:
    """`text` as a value of the first of `types` it clearly is, in vLLM's order (null,
    integer, number, boolean): null and booleans in any case, booleans as 1 and 0, numbers
    with a sign, leading zeros or no leading digit; _NONE where it is none of them."""
    low = text.lower()
    if "null" in types and low in ("null", "none"):
        return None
    if types & {"integer", "number"} and _INTEGER.fullmatch(text):
        return int(text)
    if "number" in types and _NUMBER.fullmatch(text) and math.isfinite(float(text)):
        return float(text)
    if "boolean" in types and low in ("true", "false", "1", "0"):
        return low in ("true", "1")
    return _NONE


def _finite(value: Any) -> bool:
    """Whether JSON can write `value` (no infinite or NaN number in it)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True
