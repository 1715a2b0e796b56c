"""Which decode steps sample on the device: the session hands top-k / top-p draws (with a
presence penalty too) to the backend's `sample_rows` (4 bytes per row come back) and keeps
the host sampler for what the device does not do (min-p, no top-k cut within 1024). The
backend here is numpy with the device capabilities of the backend contract stood in, so the
session's choice is what is tested; the CUDA kernel itself is tested in tests/device."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_backend import NumpyBackend
from engine.config import EngineSettings
from engine.session import Engine, GenerationParams
from tests.engine.test_forward_reference import prompt

MARK = 11  # the token the stand-in device sampler returns


class _DeviceArray:
    def __init__(self, values):
        self.values = np.asarray(values)

    def get(self):
        return self.values


class _Pending:
    def __init__(self, tokens):
        self._tokens = tokens

    def tokens(self):
        return list(self._tokens)


class DeviceStandIn(NumpyBackend):
    """The numpy backend with the device's capabilities stood in: a greedy pick with each
    step, draws handed to `sample_rows` (recorded; each picks MARK), and, where
    `launches_steps`, steps launched ahead as the decode graph does: fed by host ids, or
    (batch None) by the previous launch's pick at the next position. `force` maps a launch
    number to the token it picks."""

    samples_on_device = True
    launches_steps = False

    def __init__(self, settings=None):
        super().__init__(settings=settings)
        self.device_rows, self.launches, self.force = [], [], {}
        self.host_reads = 0
        self.model = None
        self._last = {}

    def warm_up(self, model, eager):
        self.model = model

    def to_host(self, x):
        self.host_reads += 1
        return super().to_host(x)

    def decode_step(self, model, batch, ids):
        logits = model.forward(batch, np.asarray(ids))
        return logits, _DeviceArray(np.argmax(super().to_host(logits), -1))

    def sample_rows(self, logits, greedy, rows):
        self.device_rows.append(rows)
        picks = zip(greedy.get(), rows, strict=True)
        return _DeviceArray([g if r is None else MARK for g, r in picks])

    def launch_step(self, batch, ids, rows):
        from engine.backends.base import Batch

        last = self._last
        if batch is None:
            slot, pos, ids = last["slot"], last["pos"] + 1, [last["pick"]]
        else:
            slot, pos = batch.segments[0].slot, batch.segments[0].start
        logits, greedy = self.decode_step(self.model, Batch.step([(slot, pos)]), ids)
        drawn = any(r is not None for r in rows)
        pick = int((self.sample_rows(logits, greedy, rows) if drawn else greedy).get()[0])
        pick = self.force.get(len(self.launches), pick)
        self.launches.append(batch is None)
        last.update(slot=slot, pos=pos, pick=pick)
        return _Pending([pick])


@pytest.fixture
def engine(tiny_checkpoint, monkeypatch):
    import engine.session as session

    model_dir = tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")
    monkeypatch.setattr(
        session, "select_backend", lambda settings, rows, config=None: DeviceStandIn(settings)
    )
    engine = Engine.load(model_dir, EngineSettings(backend="numpy"), context=256, max_rows=64)
    engine.device_rows = engine.backend.device_rows
    assert MARK not in engine.eos_ids
    return engine


def _reply(engine, **kw):
    params = GenerationParams(max_new_tokens=5, **kw)
    return [e.token_id for e in engine.generate(prompt(20, 400, seed=2), params)]


def test_top_k_sampling_draws_on_the_device(engine):
    reads = engine.backend.host_reads
    tokens = _reply(engine, temperature=0.7, top_k=20, top_p=0.8, seed=3)
    assert tokens[1:] == [MARK] * 4  # the first token comes from the prompt's logits
    assert len(engine.device_rows) == 4
    for (row,) in engine.device_rows:
        assert (row.temperature, row.top_k, row.top_p, row.penalty) == (0.7, 20, 0.8, 0.0)
        assert row.mark == () and not row.clear
    assert engine.backend.host_reads - reads == 1  # the prompt's last logits only
    # A seeded request hands the device the same seeds again.
    first = engine.device_rows[:]
    engine.device_rows.clear()
    assert _reply(engine, temperature=0.7, top_k=20, top_p=0.8, seed=3) == tokens
    assert engine.device_rows == first


def test_presence_penalty_samples_on_the_host_when_switched_off(engine, monkeypatch):
    from engine.sampling import Sampler

    monkeypatch.setattr(Sampler, "device_penalty", False)
    _reply(engine, temperature=0.7, presence_penalty=1.5, seed=5)
    assert engine.device_rows == []


def test_presence_penalty_marks_the_reply_on_the_device(engine):
    """The first device draw clears the slot's bitmap and marks the reply so far (the token
    picked from the prompt); later draws mark nothing new (each marks its own pick)."""
    tokens = _reply(engine, temperature=0.7, presence_penalty=1.5, seed=5)
    rows = [r for (r,) in engine.device_rows]
    assert len(rows) == 4 and all(r.penalty == 1.5 and r.slot == 0 for r in rows)
    assert rows[0].clear and rows[0].mark == (tokens[0],)
    assert all(not r.clear and r.mark == () for r in rows[1:])
    # Greedy with a penalty is a top-1 draw of the penalised logits.
    engine.device_rows.clear()
    _reply(engine, greedy=True, presence_penalty=1.0)
    assert [(r.top_k, r.penalty) for (r,) in engine.device_rows] == [(1, 1.0)] * 4
    # A reply gone on with (Continue, a thinking budget's cut): its earlier ids are marked
    # with the first draw's, the penalty counting them as the reply's.
    engine.device_rows.clear()
    tokens = _reply(engine, temperature=0.7, presence_penalty=1.5, seed=5, earlier=(3, 4))
    first = engine.device_rows[0][0]
    assert first.clear and first.mark == (3, 4, tokens[0])


@pytest.mark.parametrize("kw", [{"min_p": 0.05}, {"top_k": 0}, {"top_k": 2000}])
def test_what_the_device_sampler_lacks_stays_on_the_host(engine, kw):
    reads = engine.backend.host_reads
    tokens = _reply(engine, temperature=0.7, seed=4, **kw)
    assert engine.device_rows == []
    assert engine.backend.host_reads - reads == len(tokens)  # every step's logits came back


def test_greedy_takes_the_device_argmax(engine):
    reads = engine.backend.host_reads
    _reply(engine, greedy=True)
    assert engine.device_rows == []
    assert engine.backend.host_reads - reads == 1  # the prompt's last logits; steps read 4 bytes


@pytest.fixture
def piped(engine):
    """The same engine, its steps launched ahead (DeviceStandIn.launch_step)."""
    engine.backend.launches_steps = True
    engine.launches, engine.force = engine.backend.launches, engine.backend.force
    return engine


def _cached_ids(engine, ids):
    entry = engine.prompt_cache.lookup(list(ids) + [0])
    return None if entry is None else list(entry.ids)


@pytest.mark.parametrize("kw", [{"greedy": True}, {"temperature": 0.7, "top_k": 20, "seed": 3}])
def test_pipelined_reply_equals_the_waiting_one(piped, monkeypatch, kw):
    """One step with host ids, then each next step launched before the host reads the
    token before it; the reply, the draws handed to the device and the state kept for the
    next turn are those of the loop that waits for every token."""
    from engine.session import Engine

    ids = prompt(20, 400, seed=2)
    params = GenerationParams(max_new_tokens=6, **kw)
    monkeypatch.setattr(Engine, "pipelined_decode", False)
    want = [e.token_id for e in piped.generate(ids, params)]
    want_rows, want_cache = piped.device_rows[:], _cached_ids(piped, ids + want)
    assert piped.launches == []
    monkeypatch.setattr(Engine, "pipelined_decode", True)
    piped.device_rows.clear()
    piped.prompt_cache.clear()
    got = [e.token_id for e in piped.generate(ids, params)]
    assert got == want
    assert piped.launches == [False] + [True] * 4  # no step past the reply's last token
    seeds = [(r.seed, r.temperature, r.top_k) for (r,) in piped.device_rows]
    assert seeds == [(r.seed, r.temperature, r.top_k) for (r,) in want_rows]
    assert want_cache == ids + want[:-1]  # the last token was never fed
    assert _cached_ids(piped, ids + got) == want_cache


def test_a_stop_seen_one_step_late_stays_in_the_state(piped):
    """The step after an end-of-sequence token was launched before the host saw it: the
    stream was fed that token, and what is kept for the next turn says so."""
    eos = sorted(piped.eos_ids)[0]
    piped.force[2] = eos  # the third launch picks the stop token
    ids = prompt(20, 400, seed=2)
    reply = [e.token_id for e in piped.generate(ids, GenerationParams(max_new_tokens=10))]
    assert reply[-1] == eos and len(reply) == 4
    assert piped.launches == [False, True, True, True]  # the last one read the stop token
    assert _cached_ids(piped, ids + reply) == ids + reply


def test_no_pipelined_steps_where_a_step_cannot_read_the_picks(piped, monkeypatch):
    """A backend whose steps need their ids on the host first (embedding rows gathered on
    the host) gets the loop that waits for every token, with the same reply."""
    ids = prompt(20, 400, seed=2)
    params = GenerationParams(max_new_tokens=5, greedy=True)
    want = [e.token_id for e in piped.generate(ids, params)]
    assert piped.launches
    piped.launches.clear()
    piped.prompt_cache.clear()
    monkeypatch.setattr(piped.backend, "launches_steps", False)
    assert [e.token_id for e in piped.generate(ids, params)] == want
    assert piped.launches == []
