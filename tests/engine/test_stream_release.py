"""A reply's stream goes back when its generator is dropped, without the garbage collector
(the app's worker stops reading at the final event and lets the reply go)."""

from __future__ import annotations

from engine.config import EngineSettings
from engine.session import Engine, GenerationParams
from engine.testing.release import streams_left_busy


def test_a_reply_dropped_at_its_end_or_midway_frees_its_stream(tiny_checkpoint):
    engine = Engine.load(tiny_checkpoint(), EngineSettings(backend="numpy"), context=256, streams=1)
    params = GenerationParams(max_new_tokens=6, greedy=True)
    assert streams_left_busy(engine, [5, 6, 7, 8], params) == []
