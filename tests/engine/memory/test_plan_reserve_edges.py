"""A memory reserve at or above what the card (or the limit) can give: the verdict names
the reserve as what leaves nothing, and what to change fits when applied."""

from __future__ import annotations

import pytest

from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs


def _decide(card_gib, settings):
    config = shape_config("0.8B", "mlx4")
    card = Card(int(card_gib * GIB), int(card_gib * GIB), fused_attention=True)
    specs = shape_tensor_specs(config, "mlx4")
    return decide(specs, config, settings, card, context=4096)


@pytest.mark.parametrize(
    ("card_gib", "reserve", "limit", "said"),
    [
        (4, 5.0, None, "the 5 GiB memory reserve takes all of the card's 4 GiB free"),
        (4, 0.5, 0.3, "the 0.5 GiB memory reserve takes all of the 0.3 GiB memory limit"),
        (4, 4.0, None, "the 4 GiB memory reserve takes all of the card's 4 GiB free"),
    ],
)
def test_a_reserve_that_leaves_nothing_is_named(card_gib, reserve, limit, said):
    s = EngineSettings().with_gib(reserve=reserve, limit=limit)
    d = _decide(card_gib, s)
    assert not d.fits
    assert said in d.reason, d.reason
    assert d.suggestions
    for (setting, value), text in zip(d.fixes, d.suggestions, strict=True):
        fixed = s.with_gib(**{setting.removesuffix("_gib"): value})
        assert _decide(card_gib, fixed).fits, text


def test_a_reserve_that_leaves_room_is_not_blamed():
    d = _decide(0.6, EngineSettings().with_gib(reserve=0.5))
    assert not d.fits and "memory reserve takes all" not in d.reason, d.reason
