"""A reply's streamed text -> what the API returns: stop strings cut, thinking apart from the
answer, tool calls parsed (engine.server.tool_calls).

Qwen3.5 thinks between `<think>` and `</think>`; with thinking on, the chat template opens
the block in the prompt, so the reply starts inside it. A `</think>` where no thinking is open
(thinking off, whose template closed the block in the prompt, or a second one) is dropped,
and a call Qwen3.5 writes before closing its thinking ends the thinking there, as vLLM's
`qwen3` parser reads both. A tool call is a `<tool_call>` block;
in Qwen3.5's form its name and arguments come out as they are written ("call_start" and
"call_args" pieces, for the APIs that stream a call), and the whole call once the block
closes ("tool_call"). Text that might be the start of a marker or a stop string is held back
until the next text decides, so nothing is sent and then taken back.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.server.tool_calls import (
    CALL_CLOSE,
    CALL_OPEN,
    FUNCTION_OPEN,
    CallReader,
    ToolCall,
    cut_call,
    function_head,
    parse_tool_call,
    partial_suffix,
)
from engine.tokenizer import THINK_CLOSE, THINK_OPEN

__all__ = [
    "Piece",
    "ReplySplitter",
    "StopFilter",
    "ToolCall",
    "parse_tool_call",
    "prompt_opens_thinking",
]


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
class Piece:
    """One part of a reply: kind "reasoning" or "content" with `text`; "tool_call", a whole
    call; or, while a call in Qwen3.5's form is written, "call_start" (`call` with its name
    and id, no arguments yet) and "call_args" (`text`, the next of its arguments' JSON text),
    before the "tool_call" that ends it (the same id, the arguments those texts joined)."""

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
        self._reader: CallReader | None = None  # the call in Qwen3.5's form being read
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
        """The rest, at the end of the reply: a call cut short (in Qwen3.5's form or the
        JSON form, its name whole) ends where the reply did; another unclosed block is
        returned as it is."""
        out: list[Piece] = []
        while self._step(out, final=True):
            pass
        if self._reader is not None:
            self._take_args(out, self._reader.feed(self._buf) + self._reader.close())
            self._end_call(out, self._reader.result)
        elif self.mode == "tool" and self._buf:
            call = parse_tool_call(self._buf, self.schemas) or cut_call(self._buf)
            if call is not None:
                self._end_call(out, call)
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
            return self._tool_step(out, final)
        i, marker = self._next_marker(buf, final)
        if marker == THINK_CLOSE and self.mode == "content":
            self._buf = buf[:i] + buf[i + len(marker) :]  # no thinking is open: dropped
            return True
        if marker is not None:
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
        # Keep what may start a marker (or a marker still undecided), and trailing
        # whitespace (dropped if a marker or the end follows it).
        keep = len(buf) - i if i >= 0 else partial_suffix(buf, self._markers())
        body = buf[: len(buf) - keep]
        settled = body.rstrip()
        self._emit(out, self.mode, settled)
        self._buf = buf[len(settled) :]
        return False

    def _next_marker(self, buf: str, final: bool) -> tuple[int, str | None]:
        """(where, which) of the buffer's first marker that counts; (where, None) where one
        that may count starts but the text after it has not decided yet; (-1, None) else."""
        start = 0
        while True:
            hits = [(i, m) for m in self._markers() if (i := buf.find(m, start)) >= 0]
            if not hits:
                return -1, None
            i, marker = min(hits)
            counts = self._counts(buf, i, marker, final)
            if counts is None:
                return i, None
            if counts:
                return i, marker
            start = i + len(marker)

    def _counts(self, buf: str, i: int, marker: str, final: bool) -> bool | None:
        """Whether `marker` at `i` is one (None: not decided until more text comes).
        `<think>` opens thinking only before any of the answer's words; `<tool_call>` in
        the thinking is a call (Qwen3.5 writes some before `</think>`) only where a
        function's head follows it, so that the tag named in a thought stays a thought."""
        if marker == THINK_OPEN:
            return not buf[:i].strip()
        if marker == CALL_OPEN and self.mode == "reasoning":
            after = buf[i + len(marker) :].lstrip()
            if after.startswith(FUNCTION_OPEN):
                return True
            return None if not final and FUNCTION_OPEN.startswith(after) else False
        return True

    def _tool_step(self, out: list[Piece], final: bool) -> bool:
        """Inside a `<tool_call>` block (the buffer starts at it, or after the function's
        head once a reader has it)."""
        buf = self._buf
        if self._reader is not None:
            self._buf = ""
            self._take_args(out, self._reader.feed(buf))
            if not self._reader.done:
                return False
            self._buf, more = self._reader.rest, self._reader.more
            self._end_call(out, self._reader.result)
            self.mode = "tool" if more else self.mode  # the block's next function's call
            return True
        head = buf.removeprefix(CALL_OPEN).lstrip()
        found = function_head(head)
        if found is not None:
            name, end = found
            self._reader = CallReader(name, self.schemas)
            self._buf = head[end:]
            out.append(Piece("call_start", call=self._reader.call))
            return True
        coming = FUNCTION_OPEN.startswith(head[: len(FUNCTION_OPEN)])
        if coming and not final and ">" not in head and "\n" not in head:
            return False  # the function's head is still coming
        end = buf.find(CALL_CLOSE)  # another form: read once the block is whole
        if end < 0:
            return False
        block, self._buf = buf[: end + len(CALL_CLOSE)], buf[end + len(CALL_CLOSE) :]
        call = parse_tool_call(block, self.schemas)
        if call is None:
            self._emit(out, "content", block)
            self.mode, self._lead = "content", True
        else:
            self._end_call(out, call)
        return True

    def _take_args(self, out: list[Piece], text: str) -> None:
        if text:
            out.append(Piece("call_args", text, self._reader.call))  # type: ignore[union-attr]

    def _end_call(self, out: list[Piece], call: ToolCall) -> None:
        self.calls.append(call)
        out.append(Piece("tool_call", call=call))
        self._reader = None
        self.mode, self._lead = "content", True

    def _markers(self) -> list[str]:
        if self.mode == "reasoning":
            return [THINK_CLOSE, CALL_OPEN] if self.tools else [THINK_CLOSE]
        # A `</think>` where no thinking is open (thinking off, or a second one) is dropped.
        markers = [CALL_OPEN, THINK_CLOSE] if self.tools else [THINK_CLOSE]
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
