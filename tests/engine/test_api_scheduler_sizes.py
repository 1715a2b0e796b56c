"""The scheduler's sizes are refused by name where they are not whole numbers in range,
instead of a capacity of 4.5 requests or a TypeError from a comparison."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.scheduler import Scheduler
from engine.session import Engine


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return Engine.load(tiny_checkpoint(), EngineSettings(backend="numpy"), context=64, max_rows=32)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"queue_size": -1}, "queue_size=-1 must be a whole number >= 0"),
        ({"queue_size": 2.5}, "queue_size=2.5 must be a whole number >= 0"),
        ({"queue_size": None}, "queue_size=None must be a whole number >= 0"),
        ({"queue_size": True}, "queue_size=True must be a whole number >= 0"),
        ({"prefill_chunk": -5}, r"prefill_chunk=-5 must be a whole number >= 1 \(or None"),
        ({"prefill_chunk": 8.0}, r"prefill_chunk=8.0 must be a whole number >= 1 \(or None"),
    ],
)
def test_bad_sizes_are_refused_by_name(engine, kw, named):
    with pytest.raises(ValueError, match=named):
        Scheduler(engine, **kw)


def test_good_sizes_are_taken(engine):
    assert Scheduler(engine, queue_size=np.int64(3)).capacity == 4
    assert Scheduler(engine, queue_size=0, prefill_chunk=8).prefill_chunk == 8
    assert Scheduler(engine, prefill_chunk=None).prefill_chunk == 32
    assert Scheduler(engine, prefill_chunk=1000).prefill_chunk == 32  # at most max_rows
