"""The engine's API at its edges: refused requests leave the streams free, token ids are
checked before anything runs, the load's sizes and `max_new_tokens` are refused by name, and
an unloaded engine refuses requests instead of failing inside."""

from __future__ import annotations

import time

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.errors import ConfigError, RequestRefused, SettingOutOfRange
from engine.request_types import id_list
from engine.scheduler import Scheduler
from engine.session import Engine, GenerationParams

GREEDY = GenerationParams(max_new_tokens=3, greedy=True)


def _load(tiny_checkpoint, streams=1, **kw):
    return Engine.load(
        tiny_checkpoint(), EngineSettings(backend="numpy"), context=64, streams=streams, **kw
    )


def _tokens(engine, ids, params=GREEDY):
    return [e.token_id for e in engine.generate(ids, params)]


def test_generate_many_refused_for_streams_leaves_them_free(tiny_checkpoint):
    engine = _load(tiny_checkpoint)
    with pytest.raises(RequestRefused, match="all 1 streams are busy"):
        engine.generate_many([[1, 2], [3, 4]], GREEDY)
    assert engine._free_slots == [0]
    assert len(_tokens(engine, [1, 2])) == 3  # the next request is served
    two = _load(tiny_checkpoint, streams=2)
    with pytest.raises(RequestRefused, match="all 2 streams are busy"):
        two.generate_many([[1, 2], [3, 4], [5, 6]], GREEDY)
    assert two._free_slots == [0, 1]
    assert [len(out) for out in two.generate_many([[1, 2], [3, 4]], GREEDY)] == [3, 3]


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ([1, 2, 405], "405 at position 2"),  # the first id past the tokenizer's (padding)
        ([1, 512, 3], "512 at position 1"),  # past the embedding's rows
        ([10**30, 1], "1000000000000000000000000000000 at position 0"),
        ([5, -1], "-1 at position 1"),
        (np.array([7, -3, 9]), "-3 at position 1"),
        ([1, 2.0], "2.0 at position 1 is not an integer"),
        ([True, False], "True at position 0 is not an integer"),
    ],
)
def test_bad_token_ids_are_refused_by_id_and_position(tiny_checkpoint, ids, named):
    engine = _load(tiny_checkpoint)
    assert engine.vocab_rows == 405
    # A reply in progress holds the one stream: the bad request is refused for its ids
    # before it asks for a stream, and the reply goes on.
    reply = engine.generate([1, 2, 3], GenerationParams(max_new_tokens=4, greedy=True))
    first = next(reply)
    with pytest.raises(RequestRefused, match=named) as info:
        next(engine.generate(ids, GREEDY))
    assert "[0, 405)" in str(info.value)
    with pytest.raises(RequestRefused, match=named):
        engine.generate_many([[1, 2], ids], GREEDY)
    rest = list(reply)
    assert [first.token_id, *(e.token_id for e in rest)] == _tokens(
        engine, [1, 2, 3], GenerationParams(max_new_tokens=4, greedy=True)
    )
    assert engine._free_slots == [0]


def test_any_sequence_of_ints_is_a_prompt(tiny_checkpoint):
    engine = _load(tiny_checkpoint)
    want = _tokens(engine, [3, 4, 5])
    for ids in ((3, 4, 5), np.array([3, 4, 5]), np.array([3, 4, 5], np.uint16)):
        assert _tokens(engine, ids) == want
    assert engine.generate_many([np.array([3, 4, 5])], GREEDY) == [want]
    for empty in ([], (), np.array([], np.int64)):
        with pytest.raises(RequestRefused, match="empty"):
            next(engine.generate(empty, GREEDY))
        with pytest.raises(RequestRefused, match="empty"):
            engine.generate_many([[1, 2], empty], GREEDY)
    for odd in (5, None, [[1, 2]], iter([1, 2])):
        with pytest.raises(RequestRefused, match="sequence of token ids"):
            next(engine.generate(odd, GREEDY))
    assert engine._free_slots == [0]


def test_the_scheduler_checks_ids_at_submit(tiny_checkpoint):
    engine = _load(tiny_checkpoint)
    scheduler = Scheduler(engine)
    with pytest.raises(RequestRefused, match="700 at position 1 .*\\[0, 405\\)"):
        scheduler.submit([1, 700], GREEDY)
    with pytest.raises(RequestRefused, match="-2 at position 0"):
        scheduler.submit(np.array([-2, 5]), GREEDY)
    with pytest.raises(RequestRefused, match="empty"):
        scheduler.submit(np.array([], np.int32), GREEDY)
    assert scheduler.waiting == 0
    request = scheduler.submit(np.array([3, 4, 5]), GREEDY)
    assert request.prompt_ids == [3, 4, 5]
    while scheduler.run_once():
        pass
    assert [e.token_id for e in request] == _tokens(engine, [3, 4, 5])


def test_the_id_check_is_vectorised():
    ids = np.random.default_rng(0).integers(0, 248_077, size=200_000).tolist()
    id_list(ids, 248_077)  # warm
    t = time.perf_counter()
    assert id_list(ids, 248_077) == ids
    assert time.perf_counter() - t < 0.25
    with pytest.raises(RequestRefused, match="248077 at position 199999"):
        id_list([*ids[:-1], 248_077], 248_077)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"context": -5}, "context=-5"),
        ({"context": 0}, "context=0"),
        ({"streams": 0}, "streams=0"),
        ({"streams": -1}, "streams=-1"),
        ({"max_rows": 0}, "max_rows=0"),
        ({"max_rows": -3}, "max_rows=-3"),
    ],
)
def test_load_sizes_below_one_are_refused_by_name(tiny_checkpoint, kw, named):
    args = {"context": 64, **kw}
    with pytest.raises(ConfigError, match=f"{named}: the .* must be a whole number of at least 1"):
        Engine.load(tiny_checkpoint(), EngineSettings(backend="numpy"), **args)


def test_an_unloaded_engine_refuses_requests(tiny_checkpoint):
    engine = _load(tiny_checkpoint)
    engine.unload()
    engine.unload()  # again: nothing
    with pytest.raises(RequestRefused, match="unloaded; load it again"):
        next(engine.generate([1, 2], GREEDY))
    with pytest.raises(RequestRefused, match="unloaded; load it again"):
        engine.generate_many([[1, 2]], GREEDY)


@pytest.mark.parametrize("n", [0, -1, 2.5, True])
def test_max_new_tokens_below_one_is_refused(n):
    with pytest.raises(ValueError, match=f"max_new_tokens {n}") as info:
        GenerationParams(max_new_tokens=n)
    assert isinstance(info.value, SettingOutOfRange)
    assert GenerationParams(max_new_tokens=1).max_new_tokens == 1
