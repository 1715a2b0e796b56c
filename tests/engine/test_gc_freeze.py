"""A loaded model is outside the cyclic collector's reach: the objects `Engine.load` made
(weights, tokenizer tables, kernels) are frozen, so a collection during a prompt traverses
only what the request made. Unfrozen, full collections over them added 0.02 to 0.3 s at
random to an 8,000-token prompt on the H200 (docs/benchmarks.md)."""

from __future__ import annotations

import gc

from engine.config import EngineSettings
from engine.session import Engine, GenerationParams


def test_load_freezes_what_it_made(tiny_checkpoint):
    model = tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    engine = Engine.load(model, EngineSettings(backend="numpy"), context=256, max_rows=64)
    try:
        assert gc.get_freeze_count() > 0
        frozen_before = gc.get_freeze_count()
        reply = list(engine.generate(list(range(1, 40)), GenerationParams(max_new_tokens=4)))
        assert reply[-1].stats is not None
        assert gc.get_freeze_count() <= frozen_before  # a request freezes nothing more
    finally:
        gc.unfreeze()
        engine.unload()
