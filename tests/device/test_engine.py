"""The Engine on the GPU: admission, eager warm-up, lazy growth, refused grows, graphs."""

from __future__ import annotations

from contextlib import closing

import numpy as np
import pytest

from engine.config import GIB, EngineSettings
from engine.errors import DoesNotFit, RequestRefused, ScratchGrowFailed, WorkspaceGrowFailed
from engine.session import Engine, GenerationParams

GREEDY = GenerationParams(max_new_tokens=24, greedy=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random MLX 4-bit checkpoint (head dim 256, key head dim 128) with a tokenizer."""
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("engine") / "tiny", "tiny", "mlx4", seed=5)
    write_tokenizer(path)
    return path


def cuda(dtype="float32", **kw):
    return EngineSettings(backend="cuda", compute_dtype=dtype, **kw)


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


def tokens(engine, ids, params=GREEDY):
    return [e.token_id for e in engine.generate(ids, params)]


def test_eager_load_captures_before_the_first_request(model_dir):
    engine = Engine.load(model_dir, cuda(), context=1024, streams=2, max_rows=256)
    be = engine.backend
    assert engine.decision.eager and engine.backend_name == "cuda"
    fr = be.frame
    assert fr.mem_scratch.capacity_rows == 256  # whole scratch at warm-up (invariant 4)
    assert set(be.graphs.graphs) == {1, 2}  # every batch size captured before a request
    scratch_block = fr.mem_scratch.block
    out = tokens(engine, prompt(300))
    assert fr.mem_scratch.block is scratch_block and set(be.graphs.graphs) == {1, 2}
    used, regions = fr.scratch.used, fr.mem_scratch.layout.regions
    print(f"\n[scratch] used {used} of regions {regions}")
    assert all(used[r] <= regions[r][1] for r in used)
    engine.unload()
    assert len(out) == 24


def test_cuda_fp32_engine_matches_numpy_engine(model_dir):
    """Same greedy tokens whatever serves the request (invariant 6): numpy, CUDA eager,
    CUDA lazy (the scratch grows during the prompt and the graphs are captured again)."""
    ids = prompt(200, seed=1)
    want = tokens(Engine.load(model_dir, EngineSettings(backend="numpy"), context=1024), ids)
    eager = Engine.load(model_dir, cuda(), context=1024, max_rows=256)
    assert tokens(eager, ids) == want
    eager.unload()
    lazy = Engine.load(model_dir, cuda(), context=1024, max_rows=256, eager=False)
    assert lazy.backend.frame.mem_scratch.capacity_rows == 64
    assert tokens(lazy, ids) == want
    assert lazy.backend.frame.mem_scratch.capacity_rows == 256  # grew for the 200-row window
    # Resumed from the prompt cache equals fresh.
    follow = ids + want + prompt(7, seed=2)
    assert lazy.prompt_cache.lookup(follow) is not None
    resumed = tokens(lazy, follow)
    lazy.prompt_cache.clear()
    assert tokens(lazy, follow) == resumed
    lazy.unload()


def test_sampled_replies_are_drawn_on_the_device(model_dir, monkeypatch):
    """Top-k / top-p requests draw on the device (sample_rows), a seed repeats its reply,
    and two streams sampled together each get their own draws."""
    engine = Engine.load(model_dir, cuda("bfloat16"), context=1024, streams=2, max_rows=128)
    be, draws = engine.backend, []
    real = be.sample_rows

    def spy(logits, greedy, rows, **kw):
        draws.append(rows)
        return real(logits, greedy, rows, **kw)

    monkeypatch.setattr(be, "sample_rows", spy)
    params = GenerationParams(max_new_tokens=16, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    first = tokens(engine, prompt(30, seed=3), params)
    assert tokens(engine, prompt(30, seed=3), params) == first
    assert len(draws) == 2 * (len(first) - 1) and all(len(r) == 1 for r in draws)
    assert all(0 <= t < engine.vocab_rows for t in first)
    pair = engine.generate_many([prompt(30, seed=3), prompt(12, seed=4)], params)
    assert any(len(r) == 2 for r in draws)
    assert all(0 <= t < engine.vocab_rows for reply in pair for t in reply)
    engine.unload()


def test_presence_penalty_on_the_device_matches_numpy(model_dir):
    """Greedy with a presence penalty runs on the device as a top-1 draw of the penalised
    logits (the reply's ids in a bitmap); fp32, it picks what the numpy engine's host
    sampler picks."""
    ids = prompt(60, seed=8)
    params = GenerationParams(max_new_tokens=24, greedy=True, presence_penalty=2.0)
    host = Engine.load(model_dir, EngineSettings(backend="numpy"), context=1024)
    want = tokens(host, ids, params)
    engine = Engine.load(model_dir, cuda(), context=1024, max_rows=128)
    assert tokens(engine, ids, params) == want
    plain = tokens(engine, ids)
    if len(set(plain)) < len(plain):  # plain greedy repeats itself: the penalty must bite
        assert want != plain
    engine.unload()


def test_frequency_penalty_and_logit_bias_pick_on_the_host_as_numpy(model_dir):
    """A frequency penalty or a logit bias is applied by the host sampler only, so such a
    request's steps hand their logits to the host: fp32 greedy picks what the numpy engine
    picks, and a bias of +100 makes its token every pick."""
    ids = prompt(60, seed=8)
    freq = GenerationParams(max_new_tokens=24, greedy=True, frequency_penalty=1.5)
    bias = GenerationParams(max_new_tokens=8, greedy=True, logit_bias=((321, 100.0),))
    host = Engine.load(model_dir, EngineSettings(backend="numpy"), context=1024)
    want = tokens(host, ids, freq)
    engine = Engine.load(model_dir, cuda(), context=1024, max_rows=128)
    assert tokens(engine, ids, freq) == want
    assert tokens(engine, ids, bias) == [321] * 8
    plain = tokens(engine, ids)
    if len(set(plain)) < len(plain):  # plain greedy repeats itself: the penalty must bite
        assert want != plain
    engine.unload()


def test_a_host_scored_request_beside_a_device_drawn_one(model_dir):
    """The scheduler batches a request whose picks are made on the host (frequency
    penalty) with one drawn on the device (top-k / top-p, seeded): in batch-invariant mode
    each gets the tokens it gets alone."""
    from engine.scheduler import Scheduler

    engine = Engine.load(
        model_dir, cuda("bfloat16", batch_invariant=True), context=1024, streams=2, max_rows=128
    )
    freq = GenerationParams(max_new_tokens=20, greedy=True, frequency_penalty=1.5)
    drawn = GenerationParams(max_new_tokens=20, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    jobs = [(prompt(40, seed=5), freq), (prompt(25, seed=6), drawn)]

    def serve(chosen):
        engine.prompt_cache.clear()
        sched = Scheduler(engine, queue_size=4)
        requests = [sched.submit(ids, p, ignore_eos=True) for ids, p in chosen]
        for _ in range(5_000):
            if all(r.done.is_set() for r in requests):
                break
            sched.run_once()
        assert all(r.finish_reason == "length" for r in requests)
        return [list(r.generated) for r in requests]

    together = serve(jobs)
    assert together == [serve([job])[0] for job in jobs]
    engine.unload()


def test_pipelined_replies_equal_waiting_ones_on_the_gpu(model_dir, monkeypatch):
    """Each step launched before the host reads the token before it (`launch_step`): the
    same greedy and seeded sampled replies (presence penalty on the device) as the loop
    that waits for every token, and the same state kept for a follow-up turn."""
    engine = Engine.load(model_dir, cuda(), context=1024, max_rows=128)
    ids = prompt(50, seed=9)
    sampled = GenerationParams(max_new_tokens=24, temperature=0.7, presence_penalty=1.5, seed=4)
    replies = {}
    for piped in (False, True):
        monkeypatch.setattr(Engine, "pipelined_decode", piped)
        engine.prompt_cache.clear()
        first = tokens(engine, ids, sampled)
        follow = tokens(engine, ids + first + prompt(10, seed=3))  # resumes the kept state
        replies[piped] = (tokens(engine, ids), first, follow)
    assert replies[True] == replies[False]
    engine.unload()


def test_a_prompt_sent_again_on_the_gpu_is_read_from_its_saved_end(model_dir):
    """A prompt sent again whole restores the state saved at its end and picks its first
    token from the logits kept with it: the greedy and device-drawn replies of a fresh
    read."""
    engine = Engine.load(model_dir, cuda(), context=1024, max_rows=128)
    ids = prompt(150, seed=12)
    sampled = GenerationParams(max_new_tokens=24, temperature=0.7, top_k=20, seed=3)
    fresh = []
    for params in (GREEDY, sampled):
        engine.prompt_cache.clear()
        fresh.append(tokens(engine, ids, params))
    cache = engine.prompt_cache
    assert [tokens(engine, ids, p) for p in (GREEDY, sampled)] == fresh
    assert cache.stats.whole == 2
    engine.unload()


def test_warm_up_can_tune_the_step_by_its_own_time(model_dir, monkeypatch):
    """An eager load re-chooses the one-row step's projections in the captured graph
    (DecodeGraphs.tune) and leaves the slots as it found them: the graphs are there, and two
    identical requests get the same reply. A second load of the same shapes keeps the
    choices (the same request then gets the same tokens)."""
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
    engine = Engine.load(model_dir, cuda("bfloat16"), context=1024, streams=2, max_rows=128)
    assert len(tuned) == 1 and engine.backend.graphs.keys[1]
    assert set(engine.backend.graphs.graphs) == {1, 2}
    print(f"\n[step tuning] {tuned[0][0] * 1e3:.3f} -> {tuned[0][1] * 1e3:.3f} ms")
    ids = prompt(40, seed=12)
    assert tokens(engine, ids) == tokens(engine, ids)
    engine.unload()
    again = Engine.load(model_dir, cuda("bfloat16"), context=1024, streams=2, max_rows=128)
    assert len(tuned) == 1  # the same shapes again: the step keeps the choices it had
    again.unload()


def test_concurrent_equals_solo_on_the_gpu(model_dir):
    engine = Engine.load(model_dir, cuda(), context=1024, streams=3, max_rows=128)
    prompts = [prompt(n, seed=n) for n in (5, 150, 40)]
    together = engine.generate_many(prompts, GREEDY)
    assert together == [tokens(engine, p) for p in prompts]
    engine.unload()


def test_failed_grow_refuses_only_that_request(model_dir):
    engine = Engine.load(model_dir, cuda(), context=1024, max_rows=512, eager=False)
    be = engine.backend
    short = prompt(20, seed=3)
    want = tokens(engine, short)
    capacity, block = be.frame.mem_scratch.capacity_rows, be.frame.mem_scratch.block
    be.pool.limit = be.pool.held_bytes + 1024  # no room left to grow anything
    with pytest.raises((ScratchGrowFailed, WorkspaceGrowFailed)) as info:
        tokens(engine, prompt(400, seed=4))
    print(f"\n[refused] {type(info.value).__name__}: {info.value}")
    assert be.frame.mem_scratch.capacity_rows == capacity and be.frame.mem_scratch.block is block
    engine.prompt_cache.clear()
    assert tokens(engine, short) == want  # the engine and its buffers go on
    engine.unload()


def test_limit_too_small_is_refused_with_suggestions(model_dir):
    with pytest.raises(DoesNotFit) as info:
        Engine.load(model_dir, cuda(limit_bytes=GIB // 1024), context=1024)
    assert info.value.decision.suggestions
    assert "does not fit" in str(info.value)


def test_context_overflow_is_refused(model_dir):
    engine = Engine.load(model_dir, cuda(), context=256, max_rows=128)
    with pytest.raises(RequestRefused, match="context"):
        tokens(engine, prompt(300))
    assert len(tokens(engine, prompt(10))) == 24
    engine.unload()


def test_host_embeddings_give_the_same_tokens(tmp_path, monkeypatch):
    """Invariant 7: an untied table the card has no room for stays in host memory."""
    import dataclasses

    import engine.session as session
    from engine.testing.synth import SHAPES, write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(
        tmp_path / "untied", dict(SHAPES["tiny"], tie_word_embeddings=False), "mlx4", seed=7
    )
    write_tokenizer(path)
    ids = prompt(90, seed=8)
    on_card = Engine.load(path, cuda(), context=512, max_rows=64)
    want = tokens(on_card, ids)
    card_weights = on_card.backend.pool.held_by_category()["weights"]
    on_card.unload()
    admit = session.admit_load

    def host_embeddings(*args, **kwargs):
        return dataclasses.replace(admit(*args, **kwargs), host_embeddings=True)

    monkeypatch.setattr(session, "admit_load", host_embeddings)
    on_host = Engine.load(path, cuda(), context=512, max_rows=64)
    assert on_host.backend.state.host_table is not None
    assert on_host.backend.pool.held_by_category()["weights"] < card_weights
    assert tokens(on_host, ids) == want  # prefill windows and graph-replayed steps
    on_host.unload()


def test_fused_projections_give_the_numpy_tokens(tmp_path):
    """Decode multiplies each layer's input projections as one stored group (16 value heads
    keep every part's slice aligned), and the tokens stay the numpy engine's."""
    from engine.testing.synth import SHAPES, write_checkpoint
    from engine.testing.tiny import write_tokenizer

    shape = dict(SHAPES["tiny"], linear_num_key_heads=4, linear_num_value_heads=16)
    path = write_checkpoint(tmp_path / "fusable", shape, "mlx4", seed=9)
    write_tokenizer(path)
    ids = prompt(70, seed=9)
    want = tokens(Engine.load(path, EngineSettings(backend="numpy"), context=512), ids)
    engine = Engine.load(path, cuda(), context=512, streams=2, max_rows=64)
    weights = engine.model.w
    assert weights["layers.0.linear_attn.in_proj_qkv"].fused is not None
    assert weights["layers.3.self_attn.q_proj"].fused is not None
    assert tokens(engine, ids) == want
    assert engine.generate_many([ids, ids[:30]], GREEDY)[0] == want  # two rows: part by part
    engine.unload()


def test_saved_states_in_host_memory_resume_as_on_the_card(model_dir, monkeypatch):
    """Where the plan keeps the saved prompt states in pinned host memory, a follow-up turn
    restores from there (nothing held on the card for it) and gives the same tokens, and
    the restored state is the saved one bit for bit."""
    import dataclasses

    import engine.session as session

    admit = session.admit_load

    def on_host(*args, **kw):
        return dataclasses.replace(admit(*args, **kw), prompt_cache_on_host=True)

    first, follow = prompt(150, seed=3), None
    replies = {}
    for where in ("card", "host"):
        if where == "host":
            monkeypatch.setattr(session, "admit_load", on_host)
        engine = Engine.load(model_dir, cuda(), context=1024, max_rows=256)
        reply = tokens(engine, first)
        follow = first + reply + prompt(40, seed=4)
        entry = engine.prompt_cache.lookup(follow)
        assert entry is not None
        be = engine.backend
        assert ("pinned" in entry.snapshot) == (where == "host")
        if where == "host":
            assert "prompt_cache" not in be.pool.held_by_tag()
            slot = 0
            be.restore_slot(slot, entry.snapshot)
            again = be.state._save_to_host(slot, entry.snapshot["length"])
            for part in ("kv_k", "kv_v", "conv", "recurrent"):
                assert np.array_equal(again[part], entry.snapshot[part]), part
        replies[where] = tokens(engine, follow)
        engine.unload()
    assert replies["host"] == replies["card"]


def test_a_reply_after_the_card_tier_fills_pins_no_host_memory(model_dir, monkeypatch):
    """Once the card's tier of saved states is full, each reply's first save moves an older
    state to host memory; its buffer was pinned at the request before's end (pinning holds
    every launch, and inside a reply it stalled the decode), so nothing is pinned between a
    reply's first and last token, and the tokens are those of a fresh engine."""
    from engine.backends.cuda.state import StreamState

    fresh = Engine.load(model_dir, cuda(), context=1024, max_rows=256)
    engine = Engine.load(model_dir, cuda(), context=1024, max_rows=256)
    cache, state = engine.prompt_cache, engine.backend.state
    cache.device.budget_bytes = 2 * state.snapshot_bytes(140)  # two states of these replies
    probe = state.save_slot(0, 124)  # a reply's state: too small for the spare to take
    assert state.host_nbytes(probe) < state.snapshot_bytes(1024) // 2
    state.free_snapshot(probe)
    pinned, calls, phase = StreamState._pinned, [], ["outside"]

    def pin(total):
        calls.append(phase[0])
        return pinned(total)

    monkeypatch.setattr(StreamState, "_pinned", staticmethod(pin))
    for seed in range(5):
        ids, got = prompt(100, seed=10 + seed), []
        phase[0] = "request"
        for event in engine.generate(ids, GREEDY):  # its end's work runs at the last next()
            got.append(event.token_id)
            phase[0] = "request" if event.finished else "reply"
        phase[0] = "outside"
        assert got == tokens(fresh, ids), seed
        fresh.prompt_cache.clear()
    assert cache.stats.moved_down >= 3 and calls.count("request") >= 3  # pinned at the ends
    assert "reply" not in calls  # and never between a reply's first and last token
    engine.unload()
    fresh.unload()


def test_a_thinking_budget_on_the_gpu_is_the_numpy_engines_reply(model_dir, monkeypatch):
    """engine/thinking_budget.py over the GPU's pipelined decode (the step after the budget's
    last token is launched ahead and left in the state): the same reply as the numpy
    engine's, and the answer read on from the state saved at the cut (only the closing
    words prefilled), on the whole card and under a 4 GiB limit."""
    from engine.thinking_budget import generate_within

    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    params = GenerationParams(max_new_tokens=120, greedy=True)
    numpy_engine = Engine.load(model_dir, EngineSettings(backend="numpy"), context=1024)
    ids = numpy_engine.chat_ids(messages, enable_thinking=True)
    want = [e.token_id for e in generate_within(numpy_engine, ids, params, 6)]
    for settings in (cuda(), cuda().with_gib(limit=4)):
        engine = Engine.load(model_dir, settings, context=1024, max_rows=256)
        parts, real = [], engine.generate

        def spy(*args, real=real, parts=parts, **kwargs):
            with closing(real(*args, **kwargs)) as events:  # closed with the spy
                for event in events:
                    if event.finished:
                        parts.append(event.stats)
                    yield event

        monkeypatch.setattr(engine, "generate", spy)
        got = [e.token_id for e in generate_within(engine, ids, params, 6)]
        monkeypatch.undo()
        engine.unload()
        assert got == want
        print(f"\n[budget] second part: {parts[-1].cached_tokens} of {parts[-1].prompt_tokens}")
        assert len(parts) == 2 and parts[1].cached_tokens >= len(ids) + 5


@pytest.mark.parametrize("backend", ["numpy", "cuda"])
def test_a_reply_left_at_its_end_frees_its_stream_when_dropped(model_dir, backend):
    """A caller that stops reading at the final event (the app's worker breaks there) and
    drops the reply frees its stream at once, without the garbage collector: the reply's
    generator is in no reference cycle, on the GPU's pipelined decode as well; so is one
    dropped mid-reply, or read through a wrapping generator, plain or closed."""
    from engine.testing.release import streams_left_busy

    settings = EngineSettings(backend="numpy") if backend == "numpy" else cuda()
    engine = Engine.load(model_dir, settings, context=1024, streams=1, max_rows=256)
    ids = prompt(40, seed=9)
    try:
        assert streams_left_busy(engine, ids, GREEDY) == [], backend

        def wrapped():
            yield from (event for event in engine.generate(ids, GREEDY))

        outer = wrapped()
        next(outer)
        outer.close()
        assert engine._free_slots == [0], backend
    finally:
        engine.unload()
