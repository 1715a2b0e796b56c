"""What a command-line load says while it waits: `Engine.load` reports every stage, and only
a slow one is worth a line. A first load on a machine compiles the model's kernels for the
GPU (engine/backends/cuda/prebuild.py; half a minute for the 4B on a 16-core machine), which
would otherwise look like a hang; later loads read them from the cache in a moment."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

COMPILING = "compiling kernels"
QUIET_S = 1.0  # a compile stage that is over sooner says nothing


def load_progress(
    out: TextIO | None = None, clock: Callable[[], float] = time.monotonic
) -> Callable[[str, float], None]:
    """An `Engine.load` progress callback that writes one line to `out` (stderr) when the
    kernels are still compiling QUIET_S after the first of them was reported."""
    first: float | None = None
    said = False

    def report(stage: str, _fraction: float) -> None:
        nonlocal first, said
        if said or not stage.startswith(COMPILING):
            return
        now = clock()
        if first is None:
            first = now
        elif now - first >= QUIET_S:
            said = True
            counts = stage[len(COMPILING) :].strip(" ,")
            (out or sys.stderr).write(
                f"snug: compiling the model's kernels for this GPU ({counts} done): a first "
                "load on this machine does this once, later loads read them from the cache\n"
            )
            (out or sys.stderr).flush()

    return report


def prompt_progress(
    out: TextIO | None = None, clock: Callable[[], float] = time.monotonic
) -> Callable[[int, int], None]:
    """An `Engine.generate` progress callback for a terminal: once a prompt has run for
    QUIET_S, '(reading the prompt: N of M tokens)' on one line of `out` (stderr), drawn
    again in place as it grows and wiped when the prompt is done. Nothing off a terminal
    (a log would keep every version of the line)."""
    out = out or sys.stderr
    tty = bool(getattr(out, "isatty", lambda: False)())
    start = clock()
    shown = False

    def report(done: int, total: int) -> None:
        nonlocal shown
        if not tty:
            return
        if done >= total:
            if shown:
                out.write("\r\x1b[K")  # the line wiped: the reply starts where it was
                out.flush()
            return
        if clock() - start >= QUIET_S:
            shown = True
            text = f"(reading the prompt: {done:,} of {total:,} tokens)"
            width = _columns(out)
            if len(text) >= width:  # a wrapped line is not drawn again in place by "\r"
                text = f"({done:,}/{total:,} tokens)"[: max(width - 1, 1)]
            out.write(f"\r{text}")
            out.flush()

    return report


def _columns(out: TextIO) -> int:
    """The width of the terminal `out` writes to (80 where it cannot be read)."""
    try:
        return os.get_terminal_size(out.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80


def cpu_note(engine: Any, settings: Any, out: TextIO | None = None) -> None:
    """One line on `out` (stderr) when the backend was left to choose (auto) and the model
    runs on the CPU: why there is no GPU to run on, and that replies are slow there. (The
    backend's own log line says why a GPU that is there cannot run the model.)"""
    if getattr(settings, "backend", "auto") != "auto" or engine.backend_name != "numpy":
        return
    from engine.backend_choice import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason:
        (out or sys.stderr).write(
            f"snug: running on the CPU (numpy), far slower than a GPU: {reason}\n"
        )


def context_note(engine: Any, asked: int, out: TextIO | None = None) -> None:
    """One line on `out` (stderr) where `--context` asked for more tokens than the model
    takes (its config's max_position_embeddings, to which the load held the context): a
    prompt refused later as longer than the context then says why raising it did not help."""
    limit = engine.config.max_position_embeddings
    if asked > engine.context and engine.context >= limit:
        (out or sys.stderr).write(
            f"snug: --context {asked:,} is past the model's limit of {limit:,} tokens "
            f"(max_position_embeddings in {engine.config.source}); the context is "
            f"{engine.context:,}\n"
        )
