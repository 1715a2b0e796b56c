"""The command-line loads' one line about compiling kernels: said once, only where the
compile stage lasts (a first load on a machine), never for the quick stages; and a long
prompt's line on a terminal, drawn in place and wiped when it is done."""

from __future__ import annotations

import io

from engine.cli_progress import QUIET_S, load_progress, prompt_progress


def run(reports):
    out, now = io.StringIO(), [0.0]
    report = load_progress(out, clock=lambda: now[0])
    for t, stage in reports:
        now[0] = t
        report(stage, 0.9)
    return out.getvalue()


def test_a_long_compile_says_so_once_with_its_count():
    text = run(
        [(0.0, "loading weights"), (1.0, "compiling kernels, 1 of 58")]
        + [(1.0 + QUIET_S * i / 10, f"compiling kernels, {i} of 58") for i in range(2, 58)]
        + [(9.0, "warming up"), (14.0, "ready")]
    )
    assert text.count("\n") == 1, text
    assert "compiling the model's kernels for this GPU (" in text and "of 58 done)" in text
    assert "first load on this machine" in text


def test_a_cached_load_says_nothing():
    stages = [(0.0, "reading checkpoint"), (0.5, "loading weights"), (60.0, "warming up")]
    cached = [(2.0 + 0.001 * i, f"compiling kernels, {i} of 58") for i in range(1, 59)]
    assert run(stages[:2] + cached + stages[2:]) == ""


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_long_prompt_draws_its_line_in_place_on_a_terminal():
    def run_prompt(out, windows):
        now = [0.0]
        report = prompt_progress(out, clock=lambda: now[0])
        for t, done in windows:
            now[0] = t
            report(done, 3000)
        return out.getvalue()

    slow = [(0.2, 1000), (QUIET_S + 0.5, 2000), (QUIET_S + 1.0, 3000)]
    text = run_prompt(Terminal(), slow)
    assert text == "\r(reading the prompt: 2,000 of 3,000 tokens)\r\x1b[K"
    quick = [(0.1, 1000), (0.2, 2000), (0.3, 3000)]
    assert run_prompt(Terminal(), quick) == ""  # over before it was worth a line
    assert run_prompt(io.StringIO(), slow) == ""  # a log or a pipe gets nothing


def test_on_a_narrow_terminal_the_prompt_line_fits_on_one_row(monkeypatch):
    """A line longer than the terminal wraps, and "\r" then draws the next one on a row of
    its own: each version would stay on the screen."""
    import os

    monkeypatch.setattr(os, "get_terminal_size", lambda fd=None: os.terminal_size((24, 10)))

    class Narrow(Terminal):
        def fileno(self):
            return 2

    now, out = [0.0], Narrow()
    report = prompt_progress(out, clock=lambda: now[0])
    now[0] = QUIET_S + 0.5
    report(12_000, 34_000)
    drawn = out.getvalue()
    assert drawn == "\r(12,000/34,000 tokens)" and len(drawn) - 1 < 24
