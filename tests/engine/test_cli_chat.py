"""`snug chat`: a conversation in the terminal over the real engine (numpy backend), and
its Ctrl+C, refusals and long conversations (engine/cli_chat.py)."""

from __future__ import annotations

import io
import os
import re
import signal
from types import SimpleNamespace

import pytest

from engine.cli import main
from engine.cli_chat import chat
from engine.errors import RequestRefused


def used(err: str) -> list[int]:
    """Each reply's 'N of M tokens of context', N."""
    return [
        int(n.replace(",", "")) for n in re.findall(r"([\d,]+) of [\d,]+ tokens of context", err)
    ]


def run(monkeypatch, capsys, model, lines, *flags):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    args = ["chat", "--model", str(model), "--backend", "numpy", "--greedy", *flags]
    assert main(args) == 0
    return capsys.readouterr()


def test_a_conversation_keeps_its_turns_until_reset(tiny_checkpoint, monkeypatch, capsys):
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    lines = ["Hello there", "And a second \\", "line to it", "/help", "/reset", "Hello there"]
    got = run(monkeypatch, capsys, model, lines, "--max-new-tokens", "4", "--context", "512")
    sizes = used(got.err)
    assert len(sizes) == 3, got.err
    assert sizes[1] > sizes[0] + 4  # the second prompt holds the first exchange
    assert sizes[2] == sizes[0]  # after /reset: the same first message, the same prompt
    assert "(a new conversation)" in got.err and "/reset" in got.err  # /help's text
    assert got.out.count(">>> ") == 6 and got.out.count("... ") == 1


def test_a_refused_message_leaves_the_conversation_as_it_was(tiny_checkpoint, monkeypatch, capsys):
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    lines = ["Hi", "word " * 400, "Hi again"]
    got = run(monkeypatch, capsys, model, lines, "--max-new-tokens", "4", "--context", "128")
    assert "snug: the conversation needs" in got.err and "the context is 128" in got.err
    first, third = used(got.err)
    alone = run(
        monkeypatch, capsys, model, ["Hi", "Hi again"], "--max-new-tokens", "4", "--context", "128"
    )
    assert [first, third] == used(alone.err)  # the refused message left no trace


def test_a_long_conversation_leaves_its_oldest_turns_out(tiny_checkpoint, monkeypatch, capsys):
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    lines = [f"message {n}: " + "hello world " * 12 for n in range(6)]
    got = run(monkeypatch, capsys, model, lines, "--max-new-tokens", "4", "--context", "160")
    assert "snug:" not in got.err and len(used(got.err)) == 6
    assert "earlier messages left out" in got.err or "earlier message left out" in got.err
    assert max(used(got.err)) <= 160


class Ticking:
    """An engine that streams a token at a time until its cancel event is set; the third
    token sends this process a SIGINT (Ctrl+C)."""

    backend_name, context = "numpy", 4096

    def chat_ids(self, messages, enable_thinking=None):
        return [0] * (10 * len(messages))

    def generate(self, ids, params, cancel=None):
        for i in range(1000):
            if cancel is not None and cancel.is_set():
                break
            if i == 2:
                os.kill(os.getpid(), signal.SIGINT)
            yield SimpleNamespace(text=f"t{i} ", finished=False)
        stats = SimpleNamespace(new_tokens=i, decode_tok_s=1.0, ttft_s=0.0, prompt_tokens=len(ids))
        yield SimpleNamespace(text="", finished=True, finish_reason="cancelled", stats=stats)


def test_ctrl_c_stops_the_reply_and_the_chat_goes_on():
    out, err = io.StringIO(), io.StringIO()
    params = SimpleNamespace(max_new_tokens=1000)
    stdin = io.StringIO("first\nsecond\n")
    before = signal.getsignal(signal.SIGINT)
    assert chat(Ticking(), "fake", params, None, None, stdin, out, err) == 0
    notes = [line for line in err.getvalue().splitlines() if line.startswith("[")]
    assert len(notes) == 2 and all("stopped" in n for n in notes), err.getvalue()
    assert all(int(n[1:].split()[0]) < 10 for n in notes)  # stopped within a few tokens
    assert signal.getsignal(signal.SIGINT) is before  # the handler put back


def test_a_refusal_from_the_engine_is_reported():
    class Refusing(Ticking):
        def generate(self, ids, params, cancel=None):
            raise RequestRefused("all 1 streams are busy")

    err = io.StringIO()
    chat(
        Refusing(),
        "fake",
        SimpleNamespace(max_new_tokens=8),
        "sys",
        None,
        io.StringIO("hi\n"),
        io.StringIO(),
        err,
    )
    assert "snug: all 1 streams are busy" in err.getvalue()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_thinking_is_set_apart_and_its_tags_left_out():
    from engine.cli_chat import Shown

    out = io.StringIO()
    shown = Shown(out, thinking=True)
    for text in ("Let me", " think.</th", "ink>\n\nThe answer", " is 42."):
        shown.feed(text)
    shown.finish()
    assert out.getvalue() == "Thinking…\nLet me think.\n…done thinking.\n\nThe answer is 42.\n"
    tty = Terminal()
    shown = Shown(tty, thinking=True)
    shown.feed("Still thinking when the limit came")
    shown.finish()  # ends inside the thinking: no "done", the terminal's colour restored
    assert (
        tty.getvalue() == f"Thinking…\n{Shown.DIM}Still thinking when the limit came{Shown.PLAIN}\n"
    )
    going_on = io.StringIO()
    shown = Shown(going_on, thinking=True, resumed=True)  # /continue inside the thinking
    shown.feed("and more.</think>\n\nDone.")
    shown.finish()
    assert going_on.getvalue() == "and more.\n…done thinking.\n\nDone.\n"
    plain = io.StringIO()
    shown = Shown(plain, thinking=False)
    shown.feed("No thinking here.")
    shown.finish()
    assert plain.getvalue() == "No thinking here.\n"


def test_continue_goes_on_with_a_cut_reply(tiny_checkpoint, monkeypatch, capsys):
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    lines = ["Hello there", "/continue", "/reset", "/continue"]
    from engine.session import Engine

    asked, generate = [], Engine.generate
    monkeypatch.setattr(
        Engine, "generate", lambda self, ids, params, *a, **k: asked.append((ids, params))
        or generate(self, ids, params, *a, **k),
    )  # fmt: skip
    got = run(monkeypatch, capsys, model, lines, "--max-new-tokens", "4", "--context", "512")
    notes = [line for line in got.err.splitlines() if line.startswith("[")]
    if "hit the token limit" not in notes[0]:
        pytest.skip("the tiny model ended its reply before the limit")
    assert len(notes) == 2  # the reply, and its continuation; no new message between
    first, second = used(got.err)
    assert second > first  # the prompt, the reply so far, and more of it
    (prompt, params), (again, more) = asked
    assert params.earlier == () and more.earlier == tuple(again[len(prompt) :])  # one reply
    assert "nothing to continue" in got.err  # after /reset


def test_an_attached_file_goes_before_the_next_message(
    tiny_checkpoint, monkeypatch, capsys, tmp_path
):
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    (tmp_path / "notes.txt").write_text("alpha\nbeta\n", encoding="utf-8")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    flags = ("--max-new-tokens", "4", "--context", "512")
    lines = [f"/attach {tmp_path / 'photo.png'}", f"/attach {tmp_path / 'notes.txt'}", "Hi"]
    got = run(monkeypatch, capsys, model, lines, *flags)
    assert "snug: photo.png is a PNG image, not text" in got.err
    assert "(attached: notes.txt, 2 lines; they go with your next message)" in got.err
    # the same message typed out (a backslash goes on to the next line) reads the same prompt
    typed = ["File: notes.txt\\", "```\\", "alpha\\", "beta\\", "```\\", "\\", "Hi"]
    alone = run(monkeypatch, capsys, model, typed, *flags)
    assert used(got.err) == used(alone.err) and len(used(got.err)) == 1
    bare = run(monkeypatch, capsys, model, ["Hi"], *flags)
    assert used(bare.err)[0] < used(got.err)[0]


def test_a_refused_message_keeps_its_files_for_the_next(tmp_path):
    class Counting(Ticking):
        def __init__(self):
            self.asked = []  # each prompt's last message

        def chat_ids(self, messages, enable_thinking=None):
            self.asked.append(messages[-1]["content"])
            if len(self.asked) == 1:
                raise RequestRefused("the conversation needs 9,999 tokens")
            return [0] * 4

        def generate(self, ids, params, cancel=None):
            stats = SimpleNamespace(new_tokens=1, decode_tok_s=1.0, ttft_s=0.0, prompt_tokens=4)
            yield SimpleNamespace(text="ok", finished=True, finish_reason="stop", stats=stats)

    (tmp_path / "a.txt").write_text("apple", encoding="utf-8")
    stdin = io.StringIO(f"/attach {tmp_path / 'a.txt'}\nfirst\nsecond\nthird\n")
    err = io.StringIO()
    engine = Counting()
    chat(engine, "fake", SimpleNamespace(max_new_tokens=8), None, None, stdin, io.StringIO(), err)
    assert "snug: the conversation needs" in err.getvalue()
    file = "File: a.txt\n```\napple\n```\n\n"
    assert engine.asked[:2] == [file + "first", file + "second"]  # the refusal kept them
    assert engine.asked[2:] == ["third"]  # they went with the message the engine took


def test_on_a_terminal_lines_are_read_with_line_editing(monkeypatch, capsys):
    class Quick(Ticking):
        def generate(self, ids, params, cancel=None):
            stats = SimpleNamespace(new_tokens=1, decode_tok_s=1.0, ttft_s=0.0, prompt_tokens=4)
            yield SimpleNamespace(text="ok", finished=True, finish_reason="stop", stats=stats)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    typed = iter(["first \\", "line", "second"])
    prompts = []

    def typed_line(prompt):
        prompts.append(prompt)
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None  # Ctrl+D

    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("builtins.input", typed_line)
    engine = Quick()
    asked = []
    engine.chat_ids = lambda messages, enable_thinking=None: asked.append(list(messages)) or [0] * 4
    params = SimpleNamespace(max_new_tokens=8)
    import sys

    assert chat(engine, "fake", params, None, None, sys.stdin, sys.stdout, sys.stderr) == 0
    assert prompts == [">>> ", "... ", ">>> ", ">>> "]  # input() drew each prompt
    assert [m[-1]["content"] for m in asked] == ["first \nline", "second"]
    assert ">>>" not in capsys.readouterr().out  # not written a second time


def test_ctrl_c_while_the_prompt_runs_leaves_the_conversation_as_it_was():
    class SlowPrompt(Ticking):
        def __init__(self):
            self.asked = []

        def chat_ids(self, messages, enable_thinking=None):
            self.asked.append([m["content"] for m in messages])
            return [0] * 4

        def generate(self, ids, params, cancel=None):
            stats = SimpleNamespace(new_tokens=0, decode_tok_s=0.0, ttft_s=0.0, prompt_tokens=4)
            if len(self.asked) == 1:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C before the first token
                assert cancel.is_set()
                reason = "cancelled"
            else:
                reason = "stop"
            text = "ok" if reason == "stop" else ""
            yield SimpleNamespace(text=text, finished=True, finish_reason=reason, stats=stats)

    engine, err = SlowPrompt(), io.StringIO()
    stdin = io.StringIO("first\nsecond\n/continue\n")
    chat(engine, "fake", SimpleNamespace(max_new_tokens=8), None, None, stdin, io.StringIO(), err)
    assert "(stopped before the reply began)" in err.getvalue()
    assert engine.asked == [["first"], ["second"]]  # the stopped message left no trace
    assert "nothing to continue" in err.getvalue()


def test_a_message_not_in_utf8_or_an_unknown_command_is_not_sent():
    class Quick(Ticking):
        def __init__(self):
            self.asked = []

        def chat_ids(self, messages, enable_thinking=None):
            self.asked.append(messages[-1]["content"])
            return [0] * 4

        def generate(self, ids, params, cancel=None):
            stats = SimpleNamespace(new_tokens=1, decode_tok_s=1.0, ttft_s=0.0, prompt_tokens=4)
            yield SimpleNamespace(text="ok", finished=True, finish_reason="stop", stats=stats)

    # "caf\xe9" from a latin-1 terminal reaches the chat as a lone surrogate (surrogateescape)
    lines = ["caf\udce9", "/rest", "/atach notes.txt", "/usr/bin holds programs", "hi"]
    engine, err = Quick(), io.StringIO()
    stdin = io.StringIO("".join(f"{line}\n" for line in lines))
    params = SimpleNamespace(max_new_tokens=8)
    assert chat(engine, "fake", params, None, None, stdin, io.StringIO(), err) == 0
    assert engine.asked == ["/usr/bin holds programs", "hi"]
    assert "the message is not UTF-8 text (byte 0xe9 at offset 3)" in err.getvalue()
    assert "(unknown command /rest: /help lists them" in err.getvalue()
    assert "(unknown command /atach: /help lists them" in err.getvalue()


def test_a_thinking_budget_closes_a_long_thought(tiny_checkpoint, monkeypatch, capsys):
    """`--thinking-budget N`: the reply's thinking stops after N tokens, closed by Qwen's
    words for it (shown dimmed with the thinking), and the answer follows; a value that is
    not a number of tokens is refused by its flag."""
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    flags = ("--max-new-tokens", "120", "--context", "512", "--thinking", "on")
    got = run(monkeypatch, capsys, model, ["Why?"], *flags, "--thinking-budget", "6")
    thought, done, answer = got.out.partition("…done thinking.")
    if "</think>" in thought or not done:
        pytest.skip("the tiny model closed its thinking within the budget")
    assert "Considering the limited time by the user" in thought and answer.strip()
    assert "120 tokens" in got.err  # the whole reply's count: thinking, words and answer
    assert "thinking closed at its budget of 6 tokens" in got.err
    with pytest.raises(SystemExit):
        main(["chat", "--model", str(model), "--thinking-budget", "lots"])
    assert "--thinking-budget: expected an integer, got 'lots'" in capsys.readouterr().err


def test_retry_answers_the_last_message_again(tiny_checkpoint, monkeypatch, capsys):
    """/retry: the last message asked again, the reply it had replaced (greedy: the same
    reply); the next message's prompt holds one exchange, not two. Before any reply there
    is nothing to retry."""
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    from engine.session import Engine

    asked, generate = [], Engine.generate
    monkeypatch.setattr(
        Engine, "generate", lambda self, ids, params, *a, **k: asked.append(list(ids))
        or generate(self, ids, params, *a, **k),
    )  # fmt: skip
    lines = ["/retry", "Hello there", "/retry", "Again"]
    got = run(monkeypatch, capsys, model, lines, "--max-new-tokens", "4", "--context", "512")
    assert "nothing to retry" in got.err
    first, retried, again = asked
    assert retried == first  # the same prompt: the reply it had is gone from it
    sizes = used(got.err)
    assert len(sizes) == 3 and sizes[0] == sizes[1] and sizes[2] > sizes[1]
    one_exchange = run(monkeypatch, capsys, model, ["Hello there", "Again"], "--max-new-tokens",
                       "4", "--context", "512")  # fmt: skip
    assert used(one_exchange.err)[-1] == sizes[2]


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {"TERM": "dumb"}])
def test_thinking_is_not_dimmed_where_colour_is_turned_off(env, monkeypatch):
    """NO_COLOR (no-color.org) and a terminal that draws no escapes (TERM=dumb): the thinking
    is set apart by its words alone."""
    from engine.cli_chat import Shown

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    tty = Terminal()
    shown = Shown(tty, thinking=True)
    shown.feed("Hmm.</think>\n\nYes.")
    shown.finish()
    assert tty.getvalue() == "Thinking…\nHmm.\n…done thinking.\n\nYes.\n"
    assert "\x1b" not in tty.getvalue()
    monkeypatch.setenv("NO_COLOR", "")  # empty: not set (no-color.org)
    monkeypatch.setenv("TERM", "xterm-256color")
    coloured = Terminal()
    shown = Shown(coloured, thinking=True)
    shown.feed("Hmm.")
    shown.finish()
    assert Shown.DIM in coloured.getvalue()
