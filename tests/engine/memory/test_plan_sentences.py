"""What a decision says is true of the plan: a context named for its chunks keeps them, and
a shortfall of a few MiB is not "0 GiB"."""

from __future__ import annotations

import re

import pytest

from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs

KEEPS = re.compile(r"a context of ([\d,]+) tokens keeps chunks of ([\d,]+) tokens")


def _decide(shape, fmt, card_bytes, context, settings=None, **kw):
    config = shape_config(shape, fmt)
    card = Card(card_bytes, card_bytes, fused_attention=True)
    specs = shape_tensor_specs(config, fmt)
    return decide(specs, config, settings or EngineSettings(), card, context=context, **kw)


@pytest.mark.parametrize(
    ("shape", "fmt", "gib", "context", "named"),
    [
        ("0.8B", "mlx4", 4, 262144, True),  # 261,120 tokens keep 256-row chunks
        ("0.8B", "mlx4", 1, 4096, False),  # no context keeps them: 6,144 only in 16-row ones
        ("9B", "mlx4", 5, 4096, False),
    ],
)
def test_a_context_named_for_its_chunks_keeps_them(shape, fmt, gib, context, named):
    d = _decide(shape, fmt, gib * GIB, context)
    assert d.fits and d.max_rows < 256, d.reason
    found = KEEPS.search(d.reason)
    assert bool(found) is named, d.reason
    if found:
        shorter, rows = (int(g.replace(",", "")) for g in found.groups())
        assert shorter < context
        kept = _decide(shape, fmt, gib * GIB, shorter)
        assert kept.fits and kept.max_rows >= rows, kept.reason


def test_a_shortfall_of_a_few_mib_is_said_in_mib():
    # One arrangement only (no smaller rung below 16 rows, no saved states), so the shortfall
    # is the bytes taken off a card where the plan just fits.
    kw = dict(max_rows=16, prompt_cache_states=0)
    s = EngineSettings(reserve_bytes=0)
    fits = _decide("0.8B", "mlx4", 4 * GIB, 4096, s, **kw)
    exact = 4 * GIB - fits.breakdown.free_after
    assert _decide("0.8B", "mlx4", exact, 4096, s, **kw).fits
    d = _decide("0.8B", "mlx4", exact - 3 * 2**20, 4096, s, **kw)
    assert not d.fits and d.breakdown.free_after == -3 * 2**20
    assert "needs 3 MiB more than this card can give" in d.reason, d.reason


def test_one_token_reads_in_the_singular():
    fits = _decide("0.8B", "mlx4", 4 * GIB, 1)
    assert "at 1 token," in fits.format_table()
    short = _decide("9B", "bf16", GIB // 2, 1)
    assert "(1 stream at 1 token)" in short.reason
    assert "even at 1 token with 1 stream" in short.suggestions[-1]
