"""The lazy path as fast as the eager one, on the GPU.

- Lazy scratch: warm-up captures the decode graphs and tunes the step as an eager load does;
  a prompt's chunk that grows the scratch captures them again before it runs, and the
  decode steps after it replay graphs (none is captured during decode), launched ahead of
  the host, with the same tokens as an eager load.
- Host embeddings: the gather reads the table from mapped pinned host memory, equal to the
  gather from the card, and a reply launches its steps ahead as with the table on the card.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.config import GIB, EngineSettings
from engine.session import Engine, GenerationParams

GREEDY = GenerationParams(max_new_tokens=32, greedy=True)
SAMPLED = GenerationParams(max_new_tokens=24, temperature=0.8, top_k=40, top_p=0.9, seed=5)


def cuda(dtype="float32", **kw):
    return EngineSettings(backend="cuda", compute_dtype=dtype, **kw)


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


def tokens(engine, ids, params=GREEDY):
    return [e.token_id for e in engine.generate(ids, params)]


def _checkpoint(root, fmt, tied, seed):
    from engine.testing.synth import SHAPES, write_checkpoint
    from engine.testing.tiny import write_tokenizer

    shape = dict(SHAPES["tiny"], tie_word_embeddings=tied)
    path = write_checkpoint(root / f"{fmt}-{'tied' if tied else 'untied'}", shape, fmt, seed=seed)
    write_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("lazy"), "mlx4", True, seed=5)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    root = tmp_path_factory.mktemp("host")
    return {fmt: _checkpoint(root, fmt, False, seed=7) for fmt in ("mlx4", "bf16")}


def lazy_limit(path, dtype, context, max_rows):
    """A memory limit under which admission makes the plan lazy: one byte below the least
    limit that admits the whole scratch (found as Engine.load's admission will see it: a
    fresh backend holds nothing, and the limit binds long before the card's free bytes)."""
    import cupy

    from engine.checkpoint import Checkpoint
    from engine.memory import Card, checkpoint_specs, decide

    ck = Checkpoint.open(path)
    specs, (free, total) = checkpoint_specs(ck), cupy.cuda.runtime.memGetInfo()

    def at(limit):
        s = cuda(dtype, limit_bytes=limit)
        card = Card(total, free, 0)
        return decide(specs, ck.config, s, card, context=context, streams=1, max_rows=max_rows)

    lo, hi = 0, 8 * GIB  # the least limit with an eager decision is in (lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        d = at(mid)
        lo, hi = (lo, mid) if d.fits and d.eager else (mid, hi)
    decision = at(lo)
    assert decision.fits and not decision.eager, decision.format_table()
    return lo, decision


def test_lazy_decode_replays_graphs_after_a_grow_with_the_eager_tokens(model_dir, monkeypatch):
    from engine.memory import Verdict

    limit, planned = lazy_limit(model_dir, "float32", context=1024, max_rows=256)
    lazy = Engine.load(model_dir, cuda(limit_bytes=limit), context=1024, max_rows=256)
    d, be = lazy.decision, lazy.backend
    assert d.verdict is Verdict.FITS_LAZY and not d.eager and d.max_rows == planned.max_rows
    graphs, scratch, rows = be.graphs, be.frame.mem_scratch, d.max_rows
    print(f"\n[lazy] limit {limit:,} B: {d.reason}")
    assert set(graphs.graphs) == {1}  # captured at warm-up, lazy as eager
    assert scratch.capacity_rows < rows  # warm-up's rows: the prompt's first chunk grows it
    at_load, block = graphs.captures, scratch.block
    launched, launch = [], graphs.launch  # the steps launched without waiting for the host
    monkeypatch.setattr(graphs, "launch", lambda *a: launched.append(1) or launch(*a))
    ids = prompt(rows + 150, seed=1)  # two chunks, the first of `rows` rows
    events = lazy.generate(ids, GREEDY)
    first = next(events)  # the prompt is in; no decode step has run yet
    assert scratch.capacity_rows == rows and scratch.block is not block  # it grew
    assert graphs.captures > at_load and set(graphs.graphs) == {1}  # captured at the grow
    captured, replays = graphs.captures, graphs.replays
    out = [first.token_id] + [e.token_id for e in events]
    assert len(out) == GREEDY.max_new_tokens or out[-1] in lazy.eos_ids
    assert graphs.captures == captured  # not one capture during decode
    assert graphs.replays - replays >= len(out) - 1  # every step a graph replay,
    assert len(launched) >= len(out) - 1  # each step launched ahead of the host
    # A later reply on the grown scratch captures nothing at all.
    again = tokens(lazy, prompt(90, seed=2))
    assert graphs.captures == captured and again
    lazy.unload()
    eager = Engine.load(model_dir, cuda(), context=1024, max_rows=rows)  # the same chunks
    assert eager.decision.eager
    assert tokens(eager, ids) == out  # invariant 6: lazy or eager
    eager.unload()


def test_lazy_warm_up_tunes_the_step_and_a_grow_keeps_the_choices(model_dir, monkeypatch):
    """A lazy load re-chooses the one-row step's projections in the captured graph at warm-up
    (DecodeGraphs.tune), and the graphs a grow captures again run the same choices."""
    import engine.backends.cuda.graphs as graphs_mod
    import engine.backends.cuda.projection_tuning as tuning_mod

    monkeypatch.setitem(tuning_mod._STEP_TUNED, "bfloat16", set())  # as in a fresh process
    monkeypatch.setattr(graphs_mod, "TUNE_MAX_STEP_S", 1.0)  # the tiny model's step qualifies
    tuned = []
    tune = graphs_mod.DecodeGraphs.tune

    def spy(self, *a, **kw):
        tuned.append(tune(self, *a, **kw))
        return tuned[-1]

    monkeypatch.setattr(graphs_mod.DecodeGraphs, "tune", spy)
    engine = Engine.load(
        model_dir, cuda("bfloat16"), context=1024, streams=2, max_rows=256, eager=False
    )
    be = engine.backend
    graphs, tuner = be.graphs, be.projections.tuner
    assert len(tuned) == 1 and set(graphs.graphs) == {1, 2}
    assert be.frame.mem_scratch.capacity_rows == 64
    chosen = {k: tuner.choice[k] for k in graphs.keys[1]}
    ids = prompt(230, seed=3)
    first = tokens(engine, ids)  # grows the scratch to 256 rows
    assert be.frame.mem_scratch.capacity_rows == 256 and set(graphs.graphs) == {1, 2}
    assert {k: tuner.choice[k] for k in graphs.keys[1]} == chosen
    captured = graphs.captures
    engine.prompt_cache.clear()
    assert tokens(engine, ids) == first and graphs.captures == captured
    both = engine.generate_many([ids, prompt(40, seed=4)], GREEDY)  # two-row steps
    assert both[1] and graphs.captures == captured
    engine.unload()


@pytest.mark.parametrize("fmt", ["mlx4", "bf16"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_host_gather_equals_the_gather_from_the_card(untied, fmt, dtype):
    import cupy

    from engine.backends.cuda.host_table import host_table

    engine = Engine.load(untied[fmt], cuda(dtype), context=256, max_rows=64)
    be, config = engine.backend, engine.config
    on_card = engine.model.w["embed_tokens"]
    held = be.pool.held_bytes
    mapped = host_table(engine.checkpoint, "embed_tokens", dtype)
    assert be.pool.held_bytes == held  # no device memory
    data = mapped.packed if fmt == "mlx4" else mapped.data
    attrs = cupy.cuda.runtime.pointerGetAttributes(data.data.ptr)
    assert attrs.type == cupy.cuda.runtime.memoryTypeHost
    V, H = config.vocab_size, config.hidden_size
    rng = np.random.default_rng(6)
    ids = cupy.asarray(np.r_[rng.integers(0, V, 300), 0, V - 1], dtype=cupy.int32)
    be.stream.use()
    want = cupy.empty((len(ids), H), be.kernels.act_dtype)
    got = cupy.full((len(ids), H), 7, be.kernels.act_dtype)
    be.norms.embed_into(on_card, ids, want)
    be.norms.embed_into(mapped, ids, got)
    be.stream.synchronize()
    assert cupy.array_equal(got, want)
    del mapped, data
    engine.unload()


@pytest.mark.parametrize("fmt,lazy", [("mlx4", False), ("bf16", False), ("mlx4", True)])
def test_host_embeddings_give_the_card_tokens_launched_ahead(untied, monkeypatch, fmt, lazy):
    """A reply with the table in host memory launches each step before the host reads the
    token before it, as with the table on the card, and gives the same greedy and seeded
    sampled tokens (on the lazy path too, after a grow, without a capture during decode)."""
    import engine.session as session
    from engine.backends.cuda.graphs import DecodeGraphs

    path, ids = untied[fmt], prompt(150, seed=8)
    on_card = Engine.load(path, cuda(), context=512, max_rows=128)
    want = (tokens(on_card, ids), tokens(on_card, ids[:60], SAMPLED))
    card_weights = on_card.backend.pool.held_by_category()["weights"]
    on_card.unload()
    admit = session.admit_load

    def host_embeddings(*args, **kwargs):
        return dataclasses.replace(admit(*args, **kwargs), host_embeddings=True)

    monkeypatch.setattr(session, "admit_load", host_embeddings)
    chained = []
    replay_next = DecodeGraphs.replay_next

    def spy(self, batch_size):
        chained.append(batch_size)
        return replay_next(self, batch_size)

    monkeypatch.setattr(DecodeGraphs, "replay_next", spy)
    on_host = Engine.load(path, cuda(), context=512, max_rows=128, eager=False if lazy else None)
    be = on_host.backend
    assert on_host.decision.host_embeddings and be.launches_steps
    assert (
        be.state.host_table is not None and on_host.model.w["embed_tokens"] is be.state.host_table
    )
    assert be.pool.held_by_category()["weights"] < card_weights
    chained.clear()
    events = on_host.generate(ids, GREEDY)
    first = next(events)
    captured = be.graphs.captures
    greedy = [first.token_id] + [e.token_id for e in events]
    assert be.graphs.captures == captured  # none during decode
    assert len(chained) >= len(greedy) - 2  # each step fed by the last one's pick on the device
    assert (greedy, tokens(on_host, ids[:60], SAMPLED)) == want
    on_host.unload()
