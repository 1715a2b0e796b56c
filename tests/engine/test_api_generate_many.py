"""`Engine.generate_many` at the context's end: each prompt's reply stops where the context
is full ("length"), as `Engine.generate` and the scheduler stop it, and gives the tokens
`generate` gives it alone; nothing is refused halfway and no reply is lost."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.session import Engine, GenerationParams

LONG = GenerationParams(max_new_tokens=500, greedy=True)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    engine = Engine.load(
        tiny_checkpoint("untied-l8-r2", "hf-fp32"),
        EngineSettings(backend="numpy"),
        context=64,
        streams=2,
        max_rows=16,
    )
    engine.eos_ids = frozenset()  # random weights: every reply runs to its limit
    return engine


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, n).tolist()


def test_replies_that_run_into_the_context_end_there_as_generate_ends_them(engine):
    short, long = prompt(20, seed=1), prompt(50, seed=2)
    alone = [[e.token_id for e in engine.generate(ids, LONG)] for ids in (short, long)]
    ends = [list(engine.generate(ids, LONG))[-1].finish_reason for ids in (short, long)]
    assert ends == ["length", "length"]
    assert [len(out) for out in alone] == [64 - 20 + 1, 64 - 50 + 1]
    assert engine.generate_many([short, long], LONG) == alone
    assert engine.generate_many([long], LONG) == alone[1:]
    assert sorted(engine._free_slots) == [0, 1]


def test_a_prompt_that_fills_the_context_gets_its_one_token(engine):
    full = prompt(64, seed=3)
    want = [e.token_id for e in engine.generate(full, LONG)]
    assert len(want) == 1
    assert engine.generate_many([full, prompt(10, seed=4)], LONG)[0] == want
