"""The numbers in a verdict's sentences read as numbers: thousands grouped ("1,000,000,000
streams", "130,142,210.12 GiB"), and no size of "0 GiB" (a reserve lowered to nothing says
so in words)."""

from __future__ import annotations

import re

from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs

UNGROUPED = re.compile(r"(?<![\d,.])\d{4,}")  # four digits or more with no comma among them


def _decide(shape, fmt, card_gib, context, settings=None, **kw):
    config = shape_config(shape, fmt)
    card = Card(int(card_gib * GIB), int(card_gib * GIB), fused_attention=True)
    specs = shape_tensor_specs(config, fmt)
    return decide(specs, config, settings or EngineSettings(), card, context=context, **kw)


def test_a_huge_stream_count_and_its_shortfall_are_grouped():
    d = _decide("0.8B", "mlx4", 4, 4096, streams=10**9)
    assert not d.fits
    assert "(1,000,000,000 streams at 4,096 tokens)" in d.reason, d.reason
    for text in (d.reason, *d.suggestions):
        assert not UNGROUPED.search(text), text
    assert any(t.endswith("instead of 1,000,000,000") for t in d.suggestions), d.suggestions


def test_a_reserve_lowered_to_nothing_does_not_read_0_gib():
    # The 0.8B bf16 drafting 3 tokens at 32K on 2 GiB fits only with no reserve at all.
    s = EngineSettings(draft_tokens="3")
    d = _decide("0.8B", "bf16", 2, 32768, s)
    assert not d.fits
    fix = dict(f for f in d.fixes if len(f) == 2)
    assert fix.get("reserve_gib") == 0, d.suggestions
    for text in (d.reason, *d.suggestions):
        assert not re.search(r"(?<![\d.])0 GiB", text), text
    assert "lower the memory reserve from 0.5 GiB to none" in d.suggestions
    assert _decide("0.8B", "bf16", 2, 32768, EngineSettings(reserve_bytes=0, draft_tokens="3")).fits
