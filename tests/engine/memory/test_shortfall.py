"""A "does not fit" says by how much truly: the bytes missing in the leanest arrangement
admission would take (smallest chunks, saved states and an untied table in host memory), so
a card, or a limit, that much larger fits, and one a MiB short of it does not."""

from __future__ import annotations

import re

import pytest

from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs

MIB = 1 << 20
NEEDS = re.compile(r"needs ([\d.,]+) (GiB|MiB) more")
RAISE = re.compile(r"raise the memory limit from [\d.]+ GiB to ([\d.]+) GiB")


def _decide(shape, fmt, card_bytes, context, settings=None, **kw):
    config = shape_config(shape, fmt)
    card = Card(card_bytes, card_bytes, fused_attention=True)
    specs = shape_tensor_specs(config, fmt)
    return decide(specs, config, settings or EngineSettings(), card, context=context, **kw)


CASES = [
    ("9B", "mlx4", 4, 256),  # untied table: it may live in host memory
    ("4B", "mlx4", 2, 256),
    ("4B", "bf16", 8, 4096),
    ("0.8B", "bf16", 2, 65536),  # 16-row chunks and saved states in host memory
    ("2B", "bf16", 4, 4096),
]


@pytest.mark.parametrize(("shape", "fmt", "gib", "context"), CASES)
def test_the_shortfall_named_is_what_a_larger_card_needs(shape, fmt, gib, context):
    card = gib * GIB
    d = _decide(shape, fmt, card, context)
    assert not d.fits
    short = -d.breakdown.free_after
    assert short > 0
    amount, unit = NEEDS.search(d.reason).groups()
    said = float(amount.replace(",", "")) * (GIB if unit == "GiB" else MIB)
    assert abs(said - short) <= 0.01 * GIB, d.reason
    assert _decide(shape, fmt, card + short, context).fits, d.reason
    assert not _decide(shape, fmt, card + short - MIB, context).fits, d.reason


@pytest.mark.parametrize(("shape", "fmt", "gib", "context"), CASES)
def test_a_raised_limit_is_the_least_that_fits(shape, fmt, gib, context):
    """The limit suggestion is rounded up to 0.05 GiB: it fits, 0.05 GiB less does not."""
    limit = gib * GIB
    s = EngineSettings(limit_bytes=limit)
    d = _decide(shape, fmt, 64 * GIB, context, s)
    assert not d.fits
    found = [m for t in d.suggestions if (m := RAISE.search(t))]
    assert found, d.suggestions
    need = round(float(found[0].group(1)) * GIB)
    assert _decide(shape, fmt, 64 * GIB, context, EngineSettings(limit_bytes=need)).fits
    less = EngineSettings(limit_bytes=need - GIB // 20)
    assert not _decide(shape, fmt, 64 * GIB, context, less).fits, d.suggestions


def test_a_smaller_model_is_asked_for_by_what_the_least_plan_misses():
    """ "even at 256 tokens with 1 stream this one needs X more": a card X larger holds it."""
    d = _decide("9B", "mlx4", 4 * GIB, 4096)
    text = d.suggestions[-1]
    assert text.startswith("choose a smaller model"), d.suggestions
    amount, unit = NEEDS.search(text).groups()
    said = round(float(amount) * (GIB if unit == "GiB" else MIB))
    more = 4 * GIB + said + GIB // 100  # the sentence's rounding
    assert _decide("9B", "mlx4", more, 256, prompt_cache_states=0).fits, text
    assert not _decide("9B", "mlx4", more - GIB // 10, 256, prompt_cache_states=0).fits, text
