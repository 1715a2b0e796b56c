"""A reply's stream goes back when its generator is dropped, without the garbage collector
(the app's worker stops reading at the final event and lets the reply go)."""

from __future__ import annotations

import gc

from engine.config import EngineSettings
from engine.session import Engine, GenerationParams


def test_a_reply_dropped_at_its_end_or_midway_frees_its_stream(tiny_checkpoint):
    engine = Engine.load(tiny_checkpoint(), EngineSettings(backend="numpy"), context=256, streams=1)
    params = GenerationParams(max_new_tokens=6, greedy=True)
    gc.collect()
    gc.disable()
    try:

        def plain(*args):  # a wrapper that does not close what it wraps
            for event in engine.generate(*args):  # noqa: UP028 (yield from would close it)
                yield event

        for wrap in (engine.generate, plain):
            for stop_at in (None, 2):
                reply = wrap([5, 6, 7, 8], params)
                for n, event in enumerate(reply):
                    if event.finished or n == stop_at:
                        break
                del reply
                assert engine._free_slots == [0], (wrap.__name__, stop_at)
    finally:
        gc.enable()
