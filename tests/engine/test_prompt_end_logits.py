"""A prompt sent again whole (Regenerate, `n` replies, a client's retry) is restored from the
state saved at its end, with the logits its prefill computed for its last token: no forward
runs for it, and the reply is the one a fresh engine gives (numpy backend, fp32)."""

from __future__ import annotations

import numpy as np
import pytest

import engine.prompt_cache as prompt_cache
from engine.config import EngineSettings
from engine.scheduler import NO_TOKEN, Scheduler
from engine.session import Engine, GenerationParams

NUMPY = EngineSettings(backend="numpy")
GREEDY = GenerationParams(max_new_tokens=8, greedy=True)
SAMPLED = GenerationParams(max_new_tokens=8, temperature=0.9, top_k=20, seed=7)


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, size=length).tolist()


def load(model, **kw) -> Engine:
    return Engine.load(model, NUMPY, context=512, max_rows=64, **kw)


def reply(engine: Engine, ids: list[int], params: GenerationParams = GREEDY) -> list[int]:
    return [e.token_id for e in engine.generate(ids, params)]


def forwards(engine: Engine, monkeypatch) -> list[int]:
    """The rows of every forward the model runs from now on (a decode step's: 1)."""
    rows: list[int] = []
    run = engine.model.forward

    def counted(batch, ids, **kw):
        rows.append(len(ids))
        return run(batch, ids, **kw)

    monkeypatch.setattr(engine.model, "forward", counted)
    return rows


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")


def test_a_prompt_sent_again_runs_no_forward_and_gets_the_fresh_reply(model, monkeypatch):
    ids = prompt(100, seed=1)
    fresh = load(model)
    want_greedy, want_sampled = reply(fresh, ids), reply(fresh, ids, SAMPLED)
    fresh.unload()
    engine = load(model)
    assert reply(engine, ids) == want_greedy
    rows = forwards(engine, monkeypatch)
    events = list(engine.generate(ids, SAMPLED))
    assert [e.token_id for e in events] == want_sampled
    assert rows == [1] * (len(want_sampled) - 1)  # decode steps only: the prompt not read
    assert events[-1].stats.cached_tokens == len(ids)
    assert engine.prompt_cache.stats.whole == 1
    assert reply(engine, ids) == want_greedy  # the kept logits were not changed by a draw
    assert engine.prompt_cache.stats.whole == 2
    engine.unload()


def test_a_logit_bias_on_the_repeat_leaves_the_kept_logits_as_they_were(model):
    ids = prompt(40, seed=2)
    engine = load(model)
    first = reply(engine, ids)
    biased = GenerationParams(max_new_tokens=8, greedy=True, logit_bias=((first[0], -100.0),))
    assert reply(engine, ids, biased)[0] != first[0]
    assert reply(engine, ids) == first
    engine.unload()


def test_a_prompt_whose_state_is_gone_is_read_again(model, monkeypatch):
    """The logits alone are not enough: with the prompt-end state evicted from every tier
    the prompt is prefilled from its longest saved prefix, with the same reply."""
    ids = prompt(100, seed=3)
    engine = load(model)
    first = reply(engine, ids)
    for tier in (engine.prompt_cache.device, engine.prompt_cache.host):
        if tuple(ids) in tier:
            tier.drop(tuple(ids))
    rows = forwards(engine, monkeypatch)
    assert reply(engine, ids) == first
    assert max(rows) > 1 and engine.prompt_cache.stats.whole == 0
    engine.unload()


def test_only_the_last_prompts_keep_their_logits(model, monkeypatch):
    monkeypatch.setattr(prompt_cache, "END_LOGITS", 2)
    engine = load(model)
    prompts = [prompt(30, seed=10 + i) for i in range(3)]
    for ids in prompts:
        reply(engine, ids)
    cache = engine.prompt_cache
    assert cache.restore_end(0, prompts[0]) is None  # its logits were let go
    kept = cache.restore_end(0, prompts[2])
    assert kept is not None and kept.dtype == np.float32 and np.isfinite(kept).all()
    engine.unload()


def test_replies_to_one_prompt_in_the_scheduler_read_it_once(model, monkeypatch):
    """`n` replies (the server's path): the first request reads the prompt; the others,
    admitted with it, restore its end and pick their first token from its logits."""
    ids = prompt(100, seed=4)
    want = reply(load(model), ids)
    engine = load(model, streams=3)
    scheduler = Scheduler(engine)
    requests = [scheduler.submit(ids, GREEDY) for _ in range(3)]
    for _ in range(1000):
        if all(r.done.is_set() for r in requests):
            break
        scheduler.run_once()
    for request in requests:
        got = []
        while not request._queue.empty():
            got.append(request._queue.get().token_id)
        assert [t for t in got if t != NO_TOKEN] == want
    assert scheduler.stats.prefill_chunks == 2  # 0 -> 64 -> 100, once
    assert engine.prompt_cache.stats.whole == 2
    engine.unload()
