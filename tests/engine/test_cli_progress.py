"""The command-line loads' one line about compiling kernels: said once, only where the
compile stage lasts (a first load on a machine), never for the quick stages."""

from __future__ import annotations

import io

from engine.cli_progress import QUIET_S, load_progress


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
