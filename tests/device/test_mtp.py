"""Drafting with the MTP head on the GPU: drafted replies equal plain ones token for token
(fp32, k = 1, 2, 3, 64 steps), a verify rewinds the DeltaNet state exactly (the kept states
and conv inputs), the head computes what the numpy backend's does, and the plan
counts what drafting holds."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.config import EngineSettings
from engine.memory.arena import ALIGN
from engine.models.mtp import MtpHead
from engine.session import Engine, GenerationParams

STEPS = 64
GREEDY = GenerationParams(max_new_tokens=STEPS, greedy=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Hugging Face bf16 checkpoint with its mtp.* tensors and a tokenizer."""
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("mtp") / "tiny", "tiny", "bf16", seed=5)
    write_tokenizer(path)
    return path


def settings(draft="off", dtype="float32", backend="cuda"):
    return EngineSettings(backend=backend, compute_dtype=dtype, draft_tokens=draft)


def prompt(n=100, seed=1):
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


def reply(engine, ids=None):
    return [e.token_id for e in engine.generate(ids or prompt(), GREEDY)]


@pytest.fixture(scope="module")
def plain(model_dir):
    want = reply(Engine.load(model_dir, settings(backend="numpy"), context=1024))
    assert len(want) == STEPS  # 64 steps compared (no end-of-sequence token in the way)
    engine = Engine.load(model_dir, settings(), context=1024, max_rows=256)
    assert reply(engine) == want  # the CUDA fp32 plain reply is numpy's (invariant 6)
    engine.unload()
    return want


@pytest.mark.parametrize("k", ["1", "2", "3"])
def test_drafted_equals_plain_on_the_gpu(model_dir, plain, k):
    engine = Engine.load(model_dir, settings(k), context=1024, max_rows=256)
    assert engine.drafter is not None and engine.backend_name == "cuda"
    assert reply(engine) == plain
    # Drafts forced to the reply with some wrong: kept and rejected at every position.
    rng = np.random.default_rng(int(k))
    engine.drafter.forced = [t if rng.random() > 0.25 else (t + 1) % 400 for t in plain]
    engine.prompt_cache.clear()
    assert reply(engine) == plain
    s = engine.drafter.stats
    assert 0 < s.kept < s.drafted and all(s.kept_at[: int(k)])
    engine.unload()


def test_auto_equals_plain_on_the_gpu(model_dir, plain):
    engine = Engine.load(model_dir, settings("auto"), context=1024, max_rows=256)
    assert reply(engine) == plain
    engine.unload()


def test_rewind_on_the_gpu_gives_the_state_of_the_kept_rows(model_dir):
    engine = Engine.load(model_dir, settings("3"), context=256, streams=2, max_rows=64)
    be, model = engine.backend, engine.model
    ids, rows = prompt(20), [7, 11, 13, 17]
    model.forward(Batch.window(0, 0, len(ids)), np.asarray(ids))
    saved = be.save_slot(0, len(ids))
    for r in (1, 2, 3):
        for slot in (0, 1):
            be.restore_slot(slot, saved)
        model.forward(Batch.verify(0, len(ids), 4), np.asarray(rows))
        be.rewind(0, r)
        model.forward(Batch.window(1, len(ids), r), np.asarray(rows[:r]))
        st = be.state
        for part in (st.conv, st.recurrent):
            a = be.to_host(part[:, 0].copy())
            b = be.to_host(part[:, 1].copy())
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        nxt = Batch.step([(0, len(ids) + r), (1, len(ids) + r)])
        logits = be.to_host(model.forward(nxt, np.asarray([5, 5])))
        np.testing.assert_allclose(logits[0], logits[1], rtol=1e-3, atol=1e-4)
    be.free_snapshot(saved)
    engine.unload()


def test_the_head_on_the_gpu_computes_what_numpy_does(model_dir):
    import cupy

    hidden = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    ids, want = np.asarray([4, 5, 6]), None
    for backend in ("numpy", "cuda"):
        engine = Engine.load(model_dir, settings("1", backend=backend), context=64)
        head = MtpHead(engine.model)
        h = hidden if backend == "numpy" else cupy.asarray(hidden)
        logits = head.forward(Batch.window(0, 0, 3), ids, h, np.arange(3, dtype=np.int32))
        got = np.asarray(engine.backend.to_host(logits))
        if want is None:
            want = got
        else:
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
        engine.unload()


def test_the_plan_holds_what_drafting_allocates(model_dir):
    engine = Engine.load(model_dir, settings("2"), context=1024, max_rows=256)
    c, d = engine.config, engine.decision
    assert d.draft_tokens == 2 and engine.backend.state.kv_k.shape[0] == len(c.full_layers) + 1
    verify = engine.backend.pool.held_by_tag()["stream:verify"]
    rec = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    hist = c.conv_dim * (c.linear_conv_kernel_dim + 2) * 4  # fp32 activations
    planned = len(c.linear_layers) * (2 * rec + hist)
    assert planned <= verify <= planned + 2 * ALIGN
    engine.unload()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_verify_replays_its_graph_at_any_position(model_dir, dtype):
    """A verify's captured graph (DecodeGraphs.verify) gives what the same verify run
    eagerly gives, bit for bit, at another position than the one it was captured at (slot
    0's at warm-up; slot 1's at its first verify, which runs eagerly); each replay records
    the rows its slot keeps, so a rewind after it returns the right state."""
    engine = Engine.load(model_dir, settings("3", dtype), context=512, streams=2, max_rows=64)
    be, model = engine.backend, engine.model
    graphs = be.graphs
    ids = prompt(40)
    model.forward(Batch.window(0, 0, len(ids)), np.asarray(ids))
    saved = be.save_slot(0, len(ids))
    for slot, rows in ((0, 4), (0, 2), (1, 3), (1, 3), (1, 4)):
        window = np.asarray(prompt(rows, seed=rows))
        batch = Batch.verify(slot, len(ids), rows)
        outs = []
        for graph in (False, True):
            be.restore_slot(slot, saved)
            if graph:
                captured, before = (slot, rows) in graphs.verifies, graphs.replays
                logits, hidden = be.verify_forward(model, batch, window)
                assert graphs.replays == before + captured and (slot, rows) in graphs.verifies
            else:
                logits = model.forward(batch, window, all_logits=True, hidden=True)
                hidden = model.hidden
            outs.append((be.to_host(logits), be.to_host(hidden)))
            be.rewind(slot, 2)
            outs[-1] += (be.to_host(be.state.recurrent[:, slot].copy()),)
        for eager, replayed in zip(*outs, strict=True):
            np.testing.assert_array_equal(replayed, eager)
    assert graphs.replays > 0
    be.free_snapshot(saved)
    engine.unload()


def test_a_verify_equals_its_rows_decoded_one_by_one(model_dir):
    """fp32: a verify of 4 rows (gdn_step_split_keep on sm_90, else gdn_step_keep; the
    decode attention row by row) gives each row the logits four decode steps give it, to
    rounding, and the same state after."""
    engine = Engine.load(model_dir, settings("3"), context=512, streams=2, max_rows=64)
    be, model = engine.backend, engine.model
    ids = prompt(40)
    model.forward(Batch.window(0, 0, len(ids)), np.asarray(ids))
    saved = be.save_slot(0, len(ids))
    window = prompt(4, seed=9)
    be.restore_slot(1, saved)
    logits, _ = be.verify_forward(model, Batch.verify(1, len(ids), 4), np.asarray(window))
    verified = be.to_host(logits)
    steps = []
    for i, token in enumerate(window):
        batch = Batch.step([(0, len(ids) + i)])
        steps.append(be.to_host(model.forward(batch, np.asarray([token])))[0])
    np.testing.assert_allclose(verified, np.stack(steps), rtol=1e-4, atol=1e-4)
    for part in (be.state.conv, be.state.recurrent):
        a, b = be.to_host(part[:, 0].copy()), be.to_host(part[:, 1].copy())
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    be.free_snapshot(saved)
    engine.unload()


def test_the_head_replays_its_graph_at_any_position(model_dir):
    """The MTP head's draft-sized forwards (DecodeGraphs.head, captured at warm-up on slot
    0) give what the eager forward gives, bit for bit, at another position; a window of
    more rows than a round drafts runs eagerly."""
    engine = Engine.load(model_dir, settings("3", "bfloat16"), context=512, max_rows=64)
    be, model, graphs = engine.backend, engine.model, engine.backend.graphs
    head = engine.drafter.head
    ids = prompt(40)
    model.forward(Batch.window(0, 0, len(ids)), np.asarray(ids), hidden=True)
    hidden = be.hold_rows(model.hidden, np.arange(len(ids)))
    for rows, start in ((1, 30), (3, 20), (4, 35), (1, 38)):
        batch = Batch.window(0, start, rows)
        nexts = np.asarray(ids[start + 1 : start + rows + 1])
        h, last = hidden[start : start + rows], np.array([rows - 1], np.int32)
        want = be.to_host(head.forward(batch, nexts, h, last))
        want_hidden = be.to_host(head.hidden)
        before = graphs.replays
        got = be.to_host(be.head_forward(head, batch, nexts, h, last))
        assert graphs.replays == before + 1
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(be.to_host(head.hidden), want_hidden)
    before = graphs.replays
    be.head_forward(head, Batch.window(0, 0, 6), np.asarray(ids[1:7]), hidden[:6], None)
    assert graphs.replays == before  # 6 rows: more than a round of 3 drafts runs
    engine.unload()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_greedy_round_replays_what_runs_eagerly(model_dir, dtype):
    """A greedy round's verify and head (DecodeGraphs.follow, captured at warm-up on slot
    0, its drafts read from the device) give the ids, picks and head states that the eager
    verify and head give on another slot holding the same prompt, bit for bit."""
    from engine.backends.base import Backend

    engine = Engine.load(model_dir, settings("3", dtype), context=512, streams=2, max_rows=64)
    be, model, graphs = engine.backend, engine.model, engine.backend.graphs
    head = engine.drafter.head
    ids = np.asarray(prompt(60))
    for slot in (0, 1):
        model.forward(Batch.window(slot, 0, 30), ids[:30])
    start = 30
    for rows in (1, 2, 4, 3):
        window = ids[start : start + rows]
        want = Backend.verify_follow(be, model, head, Batch.verify(1, start, rows), window, None)
        want_hidden = be.to_host(head.hidden)
        fill = be.id_buffer(rows - 1)  # the drafts, on the device
        for i, t in enumerate(window[1:]):
            fill[i] = int(t)
        placeholders = window[:1].repeat(rows)
        before = graphs.replays
        got = be.to_host(
            be.verify_follow(model, head, Batch.verify(0, start, rows), placeholders, fill)
        )
        assert graphs.replays == before + 1
        np.testing.assert_array_equal(got, want)
        assert got[0].tolist() == window.tolist()
        np.testing.assert_array_equal(be.to_host(head.hidden), want_hidden)
        start += rows
    engine.unload()
