"""Admission's suggestions search stream and saved-state counts by bisection: the same
answers as trying each count from the top, in a few dozen checks for any count."""

from __future__ import annotations

import time

import pytest

from engine.config import GIB
from engine.memory import admission, admit
from tests.engine.memory.conftest import shape_plan


def _linear(low, high, ok):
    """Each count from the top: what the suggestions searched before."""
    return next((n for n in range(high, low - 1, -1) if ok(n)), low - 1)


@pytest.mark.parametrize("low", [0, 1])
def test_bisection_finds_what_the_linear_search_finds(low):
    for high in range(low - 1, 40):
        for edge in range(low - 1, high + 2):  # ok up to `edge`, not past it
            checked = []

            def ok(n, edge=edge, high=high, checked=checked):
                checked.append(n)
                assert low <= n <= high
                return n <= edge

            assert admission._largest(low, high, ok) == _linear(low, high, ok)


CASES = [
    ("0.8B", "mlx4", 4096, 40, 2),  # fewer streams
    ("0.8B", "mlx4", 32768, 4, 2),  # a shorter context, the 8-bit KV cache, fewer streams
    ("4B", "bf16", 16384, 5, 4),  # the 4-bit build with a shorter context
    ("4B", "bf16", 16384, 24, 4),  # the 4-bit build with fewer streams and a shorter context
]


@pytest.mark.parametrize(("shape", "fmt", "context", "streams", "gib"), CASES)
def test_suggestions_are_those_of_the_linear_search(monkeypatch, shape, fmt, context, streams, gib):
    plan = shape_plan(shape, fmt, context=context, streams=streams, max_rows=512)
    card = gib * GIB
    fast = admit(plan, card, card)
    monkeypatch.setattr(admission, "_largest", _linear)
    slow = admit(plan, card, card)
    assert not fast.fits and fast.fixes
    assert (fast.suggestions, fast.fixes) == (slow.suggestions, slow.fixes)


@pytest.mark.parametrize("fmt", ["mlx4", "bf16"])
def test_a_huge_stream_count_is_answered_at_once(monkeypatch, fmt):
    """`snug plan --streams 1000000000`: a few dozen fits tried, not a billion."""
    fits = admission._fits
    calls = []

    def counted(*args, **kw):
        calls.append(1)
        assert len(calls) < 5000, "the suggestions try the counts one by one"
        return fits(*args, **kw)

    monkeypatch.setattr(admission, "_fits", counted)
    plan = shape_plan("4B", fmt, context=4096, streams=10**9, max_rows=512)
    t = time.perf_counter()
    d = admit(plan, 4 * GIB, 4 * GIB)
    assert not d.fits and time.perf_counter() - t < 20
    assert any(f[0] == "streams" or "streams" in f for f in d.fixes), d.fixes
