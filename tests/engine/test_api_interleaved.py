"""Two replies of one engine read in turns, each on its own stream, where the backend
launches a reply's next step before the host reads its token (`Backend.launch_step`, as the
CUDA backend does; the numpy backend when `launch_ahead` is on): each reply gets the tokens
it gets alone. A launched step follows the last step launched, so a reply whose step in
flight was overtaken by another reply's forward must launch its next step afresh."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.session import Engine, GenerationParams

PARAMS = GenerationParams(max_new_tokens=12, greedy=True)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")


def load(model, ahead: bool, streams: int = 2) -> Engine:
    engine = Engine.load(
        model, EngineSettings(backend="numpy"), context=256, streams=streams, max_rows=32
    )
    engine.backend.launch_ahead = ahead
    engine.eos_ids = frozenset()  # random weights: every reply has its length
    return engine


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, n).tolist()


def alone(model, ids: list[int]) -> list[int]:
    return [e.token_id for e in load(model, False, streams=1).generate(ids, PARAMS)]


def test_two_replies_read_in_turns_each_get_their_own_tokens(model):
    a, b = prompt(40, seed=1), prompt(23, seed=2)
    engine = load(model, True)
    got_a, got_b = [], []
    for x, y in zip(engine.generate(a, PARAMS), engine.generate(b, PARAMS), strict=True):
        got_a.append(x.token_id)
        got_b.append(y.token_id)
    assert (got_a, got_b) == (alone(model, a), alone(model, b))
    assert engine._free_slots == [0, 1]


def test_a_reply_held_while_other_work_runs_goes_on_with_its_own_tokens(model):
    a, b, c = prompt(40, seed=3), prompt(30, seed=4), prompt(18, seed=5)
    engine = load(model, True)
    reply = engine.generate(a, PARAMS)
    got = [next(reply).token_id for _ in range(4)]  # a step is in flight now
    assert engine.generate_many([b], PARAMS) == [alone(model, b)]
    got.append(next(reply).token_id)
    assert [e.token_id for e in engine.generate(c, PARAMS)] == alone(model, c)
    got += [e.token_id for e in reply]
    assert got == alone(model, a)
    assert engine._free_slots == [0, 1]
