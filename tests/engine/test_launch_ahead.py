"""Steps launched ahead of their tokens, on the host: the numpy backend runs each launched
step at once (`launch_ahead`), so the reply loops a GPU runs pipelined (Engine.generate,
the scheduler) are checked here against the same loops waiting for every token."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.scheduler import Scheduler
from engine.session import Engine, GenerationParams

NUMPY = EngineSettings(backend="numpy")


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")


def load(model, ahead: bool, streams: int = 1) -> Engine:
    engine = Engine.load(model, NUMPY, context=512, streams=streams, max_rows=64)
    engine.backend.launch_ahead = ahead
    engine.eos_ids = frozenset()  # random weights: every reply has its length
    return engine


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, n).tolist()


def test_a_reply_launched_ahead_is_the_reply_that_waits(model):
    params = GenerationParams(max_new_tokens=12, greedy=True)
    ids = prompt(70, seed=1)
    plain, ahead = load(model, False), load(model, True)
    want = [e.token_id for e in plain.generate(ids, params)]
    assert [e.token_id for e in ahead.generate(ids, params)] == want
    follow = ids + want + prompt(9, seed=2)  # the next turn, from the state each one left
    assert [e.token_id for e in ahead.generate(follow, params)] == [
        e.token_id for e in plain.generate(follow, params)
    ]


# ----- the scheduler ----------------------------------------------------------------------
def events_of(request) -> list:
    out = []
    while not request._queue.empty():
        out.append(request._queue.get())
    return out


def run(scheduler: Scheduler, requests, joins: dict[int, list] | None = None) -> int:
    """Iterations until every request is done; `joins[i]`: requests submitted before
    iteration i. Returns the iterations that launched ahead."""
    joins = joins or {}
    ahead = 0
    for i in range(10_000):
        for ids, params in joins.pop(i, []):
            requests.append(scheduler.submit(ids, params))
        if not joins and all(r.done.is_set() for r in requests):
            return ahead
        scheduler.run_once()
        ahead += scheduler._ahead is not None
    raise AssertionError("requests did not finish")


def test_the_scheduler_launching_ahead_gives_each_request_its_solo_reply(model):
    """One request alone (its steps all launched ahead), then four joining and leaving at
    different steps (a join or a prefill drains the step in flight): every reply equals the
    one Engine.generate gives alone, and the slots all come back."""
    solo = load(model, False)
    cases = [(prompt(n, seed=n), GenerationParams(max_new_tokens=m, greedy=True))
             for n, m in ((40, 16), (90, 5), (7, 11), (150, 9), (12, 1))]  # fmt: skip
    want = [[e.token_id for e in solo.generate(ids, p)] for ids, p in cases]
    engine = load(model, True, streams=4)
    scheduler = Scheduler(engine)
    first: list = []
    assert run(scheduler, first, {0: [cases[0]]}) > 5  # alone: launched ahead
    assert [e.token_id for e in events_of(first[0])] == want[0]
    requests: list = []
    # The last joins while the first runs ahead alone, and ends at its first token: the
    # batch is the same after its prefill, whose forward the next launch must not follow.
    joins = {0: [cases[0]], 3: [cases[4]], 6: [cases[1]], 7: [cases[2]], 12: [cases[3]]}
    ahead = run(scheduler, requests, joins)
    got = [[e.token_id for e in events_of(r)] for r in requests]
    order = [0, 4, 1, 2, 3]  # the order they were submitted in
    assert got == [want[i] for i in order] and ahead > 0
    assert sorted(engine._free_slots) == [0, 1, 2, 3]


def test_a_cancel_and_the_context_end_a_launched_reply_as_a_waiting_one_does(model):
    """A request cancelled mid-reply frees its slot, the one beside it is unchanged; a reply
    that runs into the context stops at the same token as the loop that waits."""
    long = GenerationParams(max_new_tokens=400, greedy=True)
    ids = prompt(480, seed=3)  # context 512: 32 tokens of room
    outcomes = []
    for ahead in (False, True):
        engine = load(model, ahead, streams=2)
        scheduler = Scheduler(engine)
        requests: list = []
        run(scheduler, requests, {0: [(ids, long)]})
        events = events_of(requests[0])
        outcomes.append(([e.token_id for e in events], events[-1].finish_reason))
    assert outcomes[0] == outcomes[1] and outcomes[0][1] == "length"
    engine = load(model, True, streams=2)
    scheduler = Scheduler(engine)
    keep = GenerationParams(max_new_tokens=20, greedy=True)
    want = [e.token_id for e in load(model, False).generate(prompt(30, seed=4), keep)]
    other = scheduler.submit(prompt(30, seed=4), keep)
    gone = scheduler.submit(prompt(25, seed=5), long)
    for _ in range(8):
        scheduler.run_once()
    gone.cancel()
    run(scheduler, [other, gone])
    assert [e.token_id for e in events_of(other) if e.token_id >= 0] == want
    assert events_of(gone)[-1].finish_reason == "cancelled"
    assert sorted(engine._free_slots) == [0, 1]
