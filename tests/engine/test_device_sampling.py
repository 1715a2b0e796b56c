"""Which decode steps sample on the device: the session hands top-k / top-p draws (with a
presence penalty too) to the backend's `sample_rows` (4 bytes per row come back) and keeps
the host sampler for what the device does not do (min-p, no top-k cut within 1024). The
backend here is numpy with the two device methods stood in, so the session's choice is what
is tested; the CUDA kernel itself is tested in tests/device (test_sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.session import Engine, GenerationParams
from tests.engine.test_forward_reference import prompt

MARK = 11  # the token the stand-in device sampler returns


class _DeviceArray:
    def __init__(self, values):
        self.values = np.asarray(values)

    def get(self):
        return self.values


@pytest.fixture
def engine(tiny_checkpoint, monkeypatch):
    model_dir = tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")
    engine = Engine.load(model_dir, EngineSettings(backend="numpy"), context=256, max_rows=64)
    be = engine.backend
    engine.device_rows = []
    engine.host_reads = 0
    to_host = be.to_host

    def decode_step(batch, ids):
        logits = engine.model.forward(batch, np.asarray(ids))
        return logits, _DeviceArray(np.argmax(to_host(logits), -1))

    def sample_rows(logits, greedy, rows):
        engine.device_rows.append(rows)
        picks = zip(greedy.get(), rows, strict=True)
        return _DeviceArray([g if r is None else MARK for g, r in picks])

    def counted_to_host(x):
        engine.host_reads += 1
        return to_host(x)

    monkeypatch.setattr(be, "decode_step", decode_step, raising=False)
    monkeypatch.setattr(be, "sample_rows", sample_rows, raising=False)
    monkeypatch.setattr(be, "to_host", counted_to_host)
    assert MARK not in engine.eos_ids
    return engine


def _reply(engine, **kw):
    params = GenerationParams(max_new_tokens=5, **kw)
    return [e.token_id for e in engine.generate(prompt(20, 400, seed=2), params)]


def test_top_k_sampling_draws_on_the_device(engine):
    reads = engine.host_reads
    tokens = _reply(engine, temperature=0.7, top_k=20, top_p=0.8, seed=3)
    assert tokens[1:] == [MARK] * 4  # the first token comes from the prompt's logits
    assert len(engine.device_rows) == 4
    for (row,) in engine.device_rows:
        assert (row.temperature, row.top_k, row.top_p, row.penalty) == (0.7, 20, 0.8, 0.0)
        assert row.mark == () and not row.clear
    assert engine.host_reads - reads == 1  # the prompt's last logits only
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


@pytest.mark.parametrize("kw", [{"min_p": 0.05}, {"top_k": 0}, {"top_k": 2000}])
def test_what_the_device_sampler_lacks_stays_on_the_host(engine, kw):
    reads = engine.host_reads
    tokens = _reply(engine, temperature=0.7, seed=4, **kw)
    assert engine.device_rows == []
    assert engine.host_reads - reads == len(tokens)  # every step's logits came back


def test_greedy_takes_the_device_argmax(engine):
    reads = engine.host_reads
    _reply(engine, greedy=True)
    assert engine.device_rows == []
    assert engine.host_reads - reads == 1  # the prompt's last logits; steps read 4 bytes
