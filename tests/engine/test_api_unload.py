"""`Engine.unload` while a reply is being read: the reply's next read is refused by name
(RequestRefused, "unloaded"), not an AttributeError from inside the loop, and closing it
touches nothing of the released model."""

from __future__ import annotations

import pytest

from engine.config import EngineSettings
from engine.errors import RequestRefused
from engine.session import Engine, GenerationParams


def load(tiny_checkpoint, ahead: bool = False) -> Engine:
    engine = Engine.load(tiny_checkpoint(), EngineSettings(backend="numpy"), context=64)
    engine.backend.launch_ahead = ahead  # the loop a GPU runs, its steps launched ahead
    return engine


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("read", [1, 3])
def test_a_reply_read_after_unload_is_refused_by_name(tiny_checkpoint, ahead, read):
    engine = load(tiny_checkpoint, ahead)
    reply = engine.generate([1, 2, 3], GenerationParams(max_new_tokens=8, greedy=True))
    for _ in range(read):
        assert not next(reply).finished
    engine.unload()
    with pytest.raises(RequestRefused, match="unloaded.*load it again"):
        next(reply)
    reply.close()
    with pytest.raises(RequestRefused, match="unloaded; load it again"):
        next(engine.generate([1, 2, 3], GenerationParams(max_new_tokens=2, greedy=True)))


def test_a_reply_unloaded_at_its_final_event_closes_quietly(tiny_checkpoint):
    engine = load(tiny_checkpoint)
    reply = engine.generate([1, 2, 3], GenerationParams(max_new_tokens=2, greedy=True))
    assert [next(reply).finished, next(reply).finished] == [False, True]
    engine.unload()
    reply.close()  # the save at the reply's end is not tried on a released model
    assert len(engine.prompt_cache) == 0  # nothing kept past the unload
