"""Where no one change makes a model fit but fewer streams with a shorter context do, the
suggestion says so; "choose a smaller model" only where nothing of this model fits, and it
never names a negative shortfall."""

from __future__ import annotations

import re

import pytest

from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs
from tests.engine.memory.test_admission import _apply_all

NEGATIVE = re.compile(r"-\d")


def _decide(shape, fmt, card_gib, context, streams, limit_gib=None):
    config = shape_config(shape, fmt)
    card = Card(int(card_gib * GIB), int(card_gib * GIB), fused_attention=True)
    s = EngineSettings().with_gib(limit=limit_gib)
    specs = shape_tensor_specs(config, fmt)
    return decide(specs, config, s, card, context=context, streams=streams)


@pytest.mark.parametrize(
    ("shape", "fmt", "card_gib", "context", "streams", "limit_gib"),
    [
        ("0.8B", "mlx4", 2, 262144, 64, None),  # 1 stream at 256 tokens fits
        ("4B", "mlx4", 4, 32768, 64, 3),  # under a 3 GiB limit
        ("0.8B", "bf16", 2.5, 262144, 64, None),  # and the 4-bit build with fewer streams
    ],
)
def test_fewer_streams_with_a_shorter_context_is_suggested_and_fits(
    shape, fmt, card_gib, context, streams, limit_gib
):
    d = _decide(shape, fmt, card_gib, context, streams, limit_gib)
    assert not d.fits
    assert _decide(shape, fmt, card_gib, 256, 1, limit_gib).fits  # the model can fit here
    for text in d.suggestions:
        assert not NEGATIVE.search(text), text
        assert not text.startswith("choose a smaller model"), d.suggestions
    both = [fix for fix in d.fixes if {"streams", "context"} <= set(fix[::2])]
    assert both, d.suggestions
    for text, fix in zip(d.suggestions, d.fixes, strict=True):
        if fix[0] == "model":
            continue
        _, f2, c2, s2, _ = _apply_all(fix, None, fmt, context, streams, {})
        assert _decide(shape, f2, card_gib, c2, s2, limit_gib).fits, text
