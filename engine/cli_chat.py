"""`snug chat`: a conversation with a model in the terminal.

The model loads once; each line typed is a message, its reply streams in, and the
conversation is kept for the next one (its oldest turns left out of the prompt once it
outgrows the context: engine/context_fit.py). A line ending in a backslash goes on to the
next. Commands: /continue goes on with a reply cut by the token limit or by Ctrl+C, /retry
answers the last message again, /attach
FILE puts a text file, PDF or Word document before the next message (engine/attachments.py), /reset
starts a new conversation, /exit (or Ctrl+D) ends, /help; a line that starts like a
command but is none of them (/rest), a command other than /attach with more after it
(/reset please), or a line that is not UTF-8, is not sent. Ctrl+C stops a reply (what it
said so far is kept); at the prompt it ends the chat. A request the engine refuses (a
message longer than the context, say, or one the chat template refuses) is reported, and
the conversation stays as it was. A reply's thinking shows between "Thinking…" and "…done
thinking." (dimmed on a terminal, unless NO_COLOR is set or TERM is dumb). Reads lines from
a pipe as well, one message a line.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from engine.attachments import Attachment, AttachmentRefused, compose, read_attachment
from engine.cli_progress import prompt_progress
from engine.context_fit import fit_prompt
from engine.errors import RequestRefused, TemplateError
from engine.request_types import progress_args
from engine.server.reply import ReplySplitter
from engine.thinking_budget import applies, generate_within, starts_thinking

HELP = (
    "Type a message and press Enter (end a line with \\ to go on to the next).\n"
    "  /continue  go on with a reply cut by the token limit or by Ctrl+C\n"
    "  /retry     answer the last message again (the reply it had is replaced)\n"
    "  /attach F  give the model file F (text, PDF, Word) with the next message\n"
    "  /reset     start a new conversation\n"
    "  /exit      end (or Ctrl+D, or Ctrl+C at the prompt); Ctrl+C during a reply stops it\n"
)


def chat(
    engine: Any,
    name: str,
    params: Any,
    system: str | None,
    thinking: bool | None,
    stdin: TextIO,
    out: TextIO,
    err: TextIO,
    thinking_budget: int = 0,
) -> int:
    """The conversation loop with the model called `name` over `stdin`; replies to `out`,
    notes and stats to `err`. `thinking_budget`: the most tokens a reply thinks before it
    answers (0: no limit; engine/thinking_budget.py)."""
    head = [{"role": "system", "content": system}] if system else []
    history, left_out = list(head), 0  # messages the last prompt left out (context_fit)
    cut = False  # the last reply stopped at the token limit or on Ctrl+C: /continue
    files: list[Attachment] = []  # attached for the next message
    err.write(f"Chatting with {name} ({engine.backend_name}). /help for help.\n")
    while True:
        text = _read_message(stdin, out)
        if text is None:
            out.write("\n")
            return 0
        if not text:
            continue
        if text in ("/exit", "/quit", "/bye"):
            return 0
        if text == "/attach" or text.startswith("/attach "):
            _attach(text[len("/attach") :].strip(), files, err)
            continue
        if text == "/reset":
            history, left_out, cut, files = list(head), 0, False, []
            err.write("(a new conversation)\n")
            continue
        if text in ("/help", "/?"):
            err.write(HELP)
            continue
        misused = _command_note(text)
        if misused:
            err.write(f"({misused}; nothing was sent)\n")
            continue
        invalid = _not_utf8(text)
        if invalid:
            err.write(f"snug: {invalid}; nothing was sent\n")
            continue
        going_on, retry = text == "/continue", text == "/retry"
        if going_on and not cut:
            err.write("(nothing to continue: no reply was cut short)\n")
            continue
        if retry and history[-1:] and history[-1]["role"] == "assistant":
            replaced = history.pop()  # back if the new reply is refused or stopped at once
        elif retry:
            err.write("(nothing to retry: no reply yet)\n")
            continue
        else:
            replaced = None
        if not (going_on or retry):
            history.append({"role": "user", "content": compose(text, files)})
        asked = history[:-1] if going_on else history
        partial = history[-1]["content"] if going_on else ""
        try:
            reply, note, left_out, reason = _reply(
                engine, asked, params, thinking, left_out, out, partial, thinking_budget
            )
        except (RequestRefused, TemplateError) as exc:  # the template may refuse one message
            _undo(history, going_on, replaced)  # the conversation stays as it was
            err.write(f"snug: {exc}\n")
            continue
        if not reply and reason == "cancelled" and not going_on:  # Ctrl+C in the prompt
            _undo(history, going_on, replaced)  # as it was; the files wait
            err.write("(stopped before the reply began)\n")
            continue
        cut = reason in ("length", "cancelled")
        if going_on:
            history[-1]["content"] += reply
        else:
            history.append({"role": "assistant", "content": reply})
            files = [] if not retry else files  # they went with this message
        err.write(f"[{note}]\n")


def _undo(history: list[dict], going_on: bool, replaced: dict | None) -> None:
    """The conversation as it was before a refused or stopped request: a new message taken
    back out, a reply that /retry replaced put back."""
    if replaced is not None:
        history.append(replaced)
    elif not going_on:
        history.pop()


COMMANDS = ("/continue", "/retry", "/attach", "/reset", "/exit", "/quit", "/bye", "/help", "/?")


def _command_note(text: str) -> str | None:
    """Why a message that starts like a command is not sent: its first word is no command
    (`/rest`, `/atach notes.txt`), or a command that takes nothing has more after it
    (`/reset please`, which would otherwise reach the model as a message). None for a
    message, and for one that starts with a path (`/usr/bin/env ...`)."""
    word, *rest = text.split(maxsplit=1)
    if word not in COMMANDS:
        if re.fullmatch(r"/[A-Za-z]+", word):
            return f"unknown command {word}: /help lists them"
        return None
    if rest and word != "/attach":
        return f"{word} takes nothing after it: type {word} alone"
    return None


def _not_utf8(text: str) -> str | None:
    """Why a typed message cannot be sent (bytes that are not UTF-8 reach it as lone
    surrogates: a terminal in another encoding, a file piped in), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = text.encode("utf-8", "surrogateescape")
        where = len(text[: exc.start].encode("utf-8", "surrogateescape"))
        return (
            f"the message is not UTF-8 text (byte 0x{raw[where]:02x} at offset {where}); "
            "set the terminal to UTF-8 (LANG=C.UTF-8) or convert the input to UTF-8"
        )
    return None


def _attach(arg: str, files: list[Attachment], err: TextIO) -> None:
    """/attach FILE: the file read into `files` (or why it was not)."""
    path = arg.strip("'\"")
    if not path:
        err.write("(usage: /attach FILE: a text file, PDF or Word document for the next message)\n")
        return
    try:
        files.append(read_attachment(Path(path).expanduser()))
    except AttachmentRefused as exc:
        err.write(f"snug: {exc}\n")
        return
    names = ", ".join(f.summary() for f in files)
    err.write(f"(attached: {names}; they go with your next message)\n")


def _read_message(stdin: TextIO, out: TextIO) -> str | None:
    """One message: a line, or lines joined where each but the last ends in a backslash.
    None at the end of the input (Ctrl+D) or on Ctrl+C."""
    lines: list[str] = []
    prompt = ">>> "
    while True:
        try:
            line = _read_line(stdin, out, prompt)
        except KeyboardInterrupt:
            return None
        if line is None:
            return "\n".join(lines).strip() if lines else None
        if line.endswith("\\"):
            lines.append(line[:-1])
            prompt = "... "
            continue
        lines.append(line)
        return "\n".join(lines).strip()


def _read_line(stdin: TextIO, out: TextIO, prompt: str) -> str | None:
    """A line typed after `prompt` (None at the end of the input). On a terminal it is read
    with `input()` and readline, so the arrow keys edit the line and bring back earlier
    messages; from a pipe, as it comes."""
    if _terminal(stdin, out):
        try:
            import readline  # noqa: F401 (loading it gives input() line editing and history)
        except ImportError:  # not on every platform: input() then reads a plain line
            pass
        try:
            return input(prompt)
        except EOFError:
            return None
    out.write(prompt)
    out.flush()
    line = stdin.readline()
    return line.rstrip("\n") if line else None


def _terminal(stdin: TextIO, out: TextIO) -> bool:
    """Whether the chat reads the process's own terminal (input() reads sys.stdin)."""
    tty = getattr(stdin, "isatty", lambda: False)()
    return tty and stdin is sys.stdin and out is sys.stdout


def _reply(
    engine: Any,
    history: list[dict],
    params: Any,
    thinking: bool | None,
    previous: int,
    out: TextIO,
    partial: str = "",
    budget: int = 0,
) -> tuple[str, str, int, str | None]:
    """Stream one reply to `out` (with `partial`, go on with that reply: the prompt it
    answered, then its text so far); its text, a stats line, the messages its prompt left
    out and why it ended (the engine's finish reason: "length" and "cancelled" cut it).
    Ctrl+C while it streams sets the request's cancel event (the engine ends the reply at
    its next token, or its prompt between two windows). `budget`: the reply's thinking held
    to that many tokens (a reply gone on with inside its thinking: those it has left)."""
    more = engine.tokenizer.encode(partial) if partial else []
    most = params.max_new_tokens + len(more)
    ids, left_out = fit_prompt(engine, history, thinking, most, previous)
    ids = list(ids) + more
    if more:  # one reply: its penalties count its text so far
        params = replace(params, earlier=(*params.earlier, *more))
    cancel = threading.Event()
    handler = None
    if threading.current_thread() is threading.main_thread():
        handler = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    parts: list[str] = []
    stats, reason = None, None
    shown = Shown(out, starts_thinking(engine, ids), resumed=bool(partial))
    extra = progress_args(engine, prompt_progress())
    try:
        if applies(engine, ids, budget):  # a reply gone on with has thought `more` so far
            events = generate_within(engine, ids, params, budget, cancel, len(more), **extra)
        else:
            events = engine.generate(ids, params, cancel, **extra)
        for event in events:
            if event.text:
                parts.append(event.text)
                shown.feed(event.text)
            if event.finished:
                stats, reason = event.stats, event.finish_reason
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        shown.finish()
    note = _note(stats, reason, left_out, engine.context)
    return "".join(parts), note, left_out, reason


class Shown:
    """A reply as it streams to the terminal: its thinking between "Thinking…" and "…done
    thinking." (dimmed on a terminal), the tags themselves left out, then the answer
    (engine/server/reply.py's splitter, as the API's reasoning_content)."""

    DIM, PLAIN = "\x1b[2m", "\x1b[0m"

    def __init__(self, out: TextIO, thinking: bool, resumed: bool = False) -> None:
        """`thinking`: the reply starts inside a thinking block; `resumed`: it goes on with
        one already shown (no second "Thinking…")."""
        self.out, self.kind = out, ""
        self.splitter = ReplySplitter(thinking)
        self.tty = bool(getattr(out, "isatty", lambda: False)()) and _colour_allowed()
        if thinking and resumed:
            self.kind = "reasoning"
            self.out.write(self.DIM if self.tty else "")

    def feed(self, text: str) -> None:
        for piece in self.splitter.feed(text):
            self._write(piece.kind, piece.text)
        self.out.flush()

    def finish(self) -> None:
        """The rest; a reply that ends inside its thinking (stopped, or at the token limit)
        ends there, without "done"."""
        for piece in self.splitter.finish():
            self._write(piece.kind, piece.text)
        self.out.write((self.PLAIN if self.tty and self.kind == "reasoning" else "") + "\n")
        self.out.flush()

    def _write(self, kind: str, text: str) -> None:
        if kind != self.kind:
            if self.kind == "reasoning":
                self.out.write((self.PLAIN if self.tty else "") + "\n…done thinking.\n\n")
            if kind == "reasoning":
                self.out.write("Thinking…\n" + (self.DIM if self.tty else ""))
            self.kind = kind
        self.out.write(text)


def _colour_allowed() -> bool:
    """Whether a terminal may be written escapes that dim text: not where NO_COLOR is set to
    anything (no-color.org) or TERM is dumb (a terminal that would show them as text)."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _note(stats: Any, reason: str | None, left_out: int, context: int) -> str:
    bits = []
    if stats is not None:
        bits.append(f"{stats.new_tokens} token{'' if stats.new_tokens == 1 else 's'}")
        if stats.new_tokens > 1 and stats.decode_tok_s > 0:  # one token has no decode rate
            bits.append(f"{stats.decode_tok_s:.1f} tok/s")
        bits.append(f"first token {stats.ttft_s:.2f} s")
        used = min(stats.prompt_tokens + stats.new_tokens, context)  # a reply's last token
        bits.append(f"{used:,} of {context:,} tokens of context")  # is never fed
    cut = getattr(stats, "thinking_cut", 0)  # a stand-in engine's stats may not say
    if cut:
        bits.append(f"thinking closed at its budget of {cut:,} token{'' if cut == 1 else 's'}")
    if left_out:
        bits.append(f"{left_out} earlier message{'' if left_out == 1 else 's'} left out")
    if reason == "cancelled":
        bits.append("stopped")
    elif reason == "length":
        bits.append("hit the token limit")
    return " · ".join(bits)
