"""Drafting with the MTP head on the numpy backend: the reply drafting gives is the reply
decoding gives, token for token; a rejected draft rolls the DeltaNet state back exactly;
checkpoints without `mtp.*` say why they cannot draft."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.backends.numpy_backend import NumpyBackend
from engine.checkpoint import Checkpoint
from engine.config import EngineSettings
from engine.memory import checkpoint_specs
from engine.memory.draft import unavailable_reason
from engine.models.mtp import MtpHead
from engine.models.qwen35 import Qwen35Model
from engine.session import Engine, GenerationParams
from engine.testing.synth import write_checkpoint
from engine.testing.tiny import write_tokenizer

# A small shape the host runs quickly (the DeltaNet head sizes are synth's, 128).
SHAPE = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    intermediate_size=256,
    vocab_size=512,
    tie_word_embeddings=True,
)
STEPS = 64
GREEDY = GenerationParams(max_new_tokens=STEPS, greedy=True)


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory):
    out = write_checkpoint(tmp_path_factory.mktemp("mtp") / "hf", SHAPE, "bf16", seed=3, mtp=True)
    write_tokenizer(out)
    return out


def prompt(n=40, seed=1):
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


def load(model_dir, draft="off", context=512):
    return Engine.load(model_dir, EngineSettings(backend="numpy", draft_tokens=draft), context)


def reply(engine, ids, params=GREEDY):
    return [e.token_id for e in engine.generate(ids, params)]


@pytest.fixture(scope="module")
def plain(mtp_dir):
    out = reply(load(mtp_dir), prompt())
    assert len(out) == STEPS  # no end-of-sequence token in the way: 64 steps compared
    return out


@pytest.mark.parametrize("k", ["1", "2", "3", "auto"])
def test_drafted_reply_equals_plain_one(mtp_dir, plain, k):
    engine = load(mtp_dir, k)
    assert engine.drafter is not None and "MTP head" in engine.drafting
    assert reply(engine, prompt()) == plain
    stats = engine.drafter.stats
    assert stats.rounds + stats.plain > 0 and stats.tokens + stats.plain == STEPS - 1


@pytest.mark.parametrize("k", [1, 2, 3])
def test_forced_drafts_keep_and_reject_at_every_position(mtp_dir, plain, k):
    """Drafts forced to the known reply, some of them wrong: every count of kept drafts
    occurs, each rejection rolls back, and the reply stays the plain one."""
    engine = load(mtp_dir, k)
    rng = np.random.default_rng(k)
    forced = [t if rng.random() > 0.25 else (t + 1) % 400 for t in plain]
    engine.drafter.forced = forced
    assert reply(engine, prompt()) == plain
    s = engine.drafter.stats
    assert 0 < s.kept < s.drafted  # some kept, some rejected
    assert all(kept > 0 for kept in s.kept_at[:k])  # drafts kept at every position
    engine.drafter.forced = list(plain)  # every draft right: k + 1 tokens a round
    before = s.rounds
    assert reply(engine, prompt()) == plain
    assert s.rounds - before <= -(-(STEPS - 1) // (k + 1)) + 1


def test_each_reply_counts_its_own_drafts(mtp_dir, plain):
    """A reply's stats say how many drafts the head made for it and how many were kept: the
    drafter's counts over that reply, all of them kept when every draft is right, none when
    the engine does not draft; a plain request served beside a drafting one counts none."""
    from engine.scheduler import Scheduler

    engine = load(mtp_dir, "2")
    rng = np.random.default_rng(5)
    s = engine.drafter.stats
    for forced in ([t if rng.random() > 0.3 else (t + 1) % 400 for t in plain], list(plain)):
        engine.drafter.forced = forced
        drafted, kept = s.drafted, s.kept
        stats = list(engine.generate(prompt(), GREEDY))[-1].stats
        assert (stats.drafted, stats.drafts_kept) == (s.drafted - drafted, s.kept - kept)
        assert stats.drafted > 0
    assert stats.drafts_kept == stats.drafted  # the second reply: every draft right
    plain_stats = list(load(mtp_dir).generate(prompt(), GREEDY))[-1].stats
    assert (plain_stats.drafted, plain_stats.drafts_kept) == (0, 0)

    engine = Engine.load(mtp_dir, EngineSettings(backend="numpy", draft_tokens="2"), 512, streams=2)
    engine.drafter.forced = list(plain)
    scheduler = Scheduler(engine)
    first = scheduler.submit(prompt(), GREEDY)
    for _ in range(3):
        scheduler.run_once()
    second = scheduler.submit(prompt(30, seed=2), GREEDY)
    while not (first.done.is_set() and second.done.is_set()):
        scheduler.run_once()
    counts = []
    for request in (first, second):
        events = []
        while not request._queue.empty():
            events.append(request._queue.get())
        final = [e for e in events if e.finished][-1].stats
        counts.append((final.drafted, final.drafts_kept))
    assert counts[0][0] > 0 and counts[0][1] == counts[0][0]
    assert sum(c[0] for c in counts) == engine.drafter.stats.drafted


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_rounds_draft_as_the_waiting_rounds_do(mtp_dir, plain, k, monkeypatch):
    """A greedy reply's rounds (drafts on the backend, the verify and the head after it in
    one forward) give the drafts and picks of the rounds that wait for each draft (which a
    sampler that picks on the host takes), with the head's own drafts and forced ones."""
    from engine import speculative
    from engine.sampling import Sampler

    calls = []
    accept = speculative.accept_greedy

    def logged(drafts, picks):
        calls.append(([int(d) for d in drafts], [int(p) for p in picks]))
        return accept(drafts, picks)

    monkeypatch.setattr(speculative, "accept_greedy", logged)
    rng = np.random.default_rng(k)
    # Partly right drafts for the first 40 tokens, then the head's own after rounds that
    # kept some (which a round's first draft depends on).
    forced = [t if rng.random() > 0.3 else (t + 1) % 400 for t in plain[:40]]
    rounds = {}
    for path in ("one wait", "waits"):
        if path == "waits":
            monkeypatch.setattr(Sampler, "takes_argmax", property(lambda self: False))
        for force in (None, forced):  # the head's own drafts, then partly right ones
            engine = load(mtp_dir, str(k))
            engine.drafter.forced = force
            calls.clear()
            assert reply(engine, prompt()) == plain
            rounds[path, force is None] = list(calls)
    assert rounds["one wait", True] == rounds["waits", True]
    assert rounds["one wait", False] == rounds["waits", False]
    assert len(rounds["one wait", False]) < STEPS - 1  # forced drafts were kept


def test_a_request_joining_a_drafting_stream_leaves_both_replies_whole(mtp_dir, plain):
    """Served: a drafting reply's verify feeds several tokens at once; when a second request
    joins its batch at any step, those tokens are handed out first and both replies are the
    ones each gets alone."""
    from engine.scheduler import NO_TOKEN, Scheduler

    other = prompt(30, seed=2)
    want = reply(load(mtp_dir), other)
    engine = Engine.load(mtp_dir, EngineSettings(backend="numpy", draft_tokens="2"), 512, streams=2)

    def tokens(request):
        out = []
        while not request._queue.empty():
            out.append(request._queue.get().token_id)
        return [t for t in out if t != NO_TOKEN]

    for wait in range(1, 7):  # every place in a round of two drafts, twice
        engine.prompt_cache.clear()
        engine.drafter.forced = list(plain)  # every draft kept: tokens queue up
        scheduler = Scheduler(engine)
        first = scheduler.submit(prompt(), GREEDY)
        for _ in range(wait):
            scheduler.run_once()
        second = scheduler.submit(other, GREEDY)
        while not (first.done.is_set() and second.done.is_set()):
            scheduler.run_once()
        assert tokens(first) == plain and tokens(second) == want, wait


def test_rewind_gives_the_state_of_the_kept_rows(mtp_dir):
    """A verify of 4 rows rewound to r rows leaves the DeltaNet state that a window of those
    r rows leaves, and the next step then gives the same logits."""
    ckpt = Checkpoint.open(mtp_dir)
    backend = NumpyBackend()
    backend.draft_tokens = 3
    model = Qwen35Model(ckpt.config, backend, backend.load_weights(ckpt, ckpt.config))
    backend.alloc_state(ckpt.config, 2, 128)
    ids, rows = prompt(20), [7, 11, 13, 17]
    model.forward(Batch.window(0, 0, len(ids)), np.asarray(ids))
    saved = backend.save_slot(0, len(ids))  # the prompt's state, for both slots each time
    for r in (1, 2, 3):
        for slot in (0, 1):
            backend.restore_slot(slot, saved)
        model.forward(Batch.verify(0, len(ids), 4), np.asarray(rows))
        moved = [a[0].copy() for a in backend.recurrent]
        backend.rewind(0, r)
        model.forward(Batch.window(1, len(ids), r), np.asarray(rows[:r]))
        for a in (*backend.conv, *backend.recurrent):
            np.testing.assert_allclose(a[0], a[1], rtol=1e-5, atol=1e-5)  # BLAS rounding
        layers = zip(moved, backend.recurrent, strict=True)
        assert any(not np.allclose(m, a[1], atol=1e-3) for m, a in layers)  # it did move
        nxt = Batch.step([(0, len(ids) + r), (1, len(ids) + r)])
        logits = model.forward(nxt, np.asarray([5, 5]))
        np.testing.assert_allclose(logits[0], logits[1], rtol=1e-4, atol=1e-5)


def test_head_reads_embedding_first_and_writes_its_own_kv(mtp_dir):
    """The head's fc takes [embedding | hidden]: swapping the halves changes its output;
    its KV layer is the backend's last one, after the model's."""
    ckpt = Checkpoint.open(mtp_dir)
    backend = NumpyBackend()
    backend.draft_tokens = 1
    model = Qwen35Model(ckpt.config, backend, backend.load_weights(ckpt, ckpt.config))
    backend.alloc_state(ckpt.config, 1, 64)
    head = MtpHead(model)
    assert head.layer == len(ckpt.config.full_layers) == len(backend.kv_k) - 1
    hidden = np.random.default_rng(0).standard_normal((3, SHAPE["hidden_size"]), np.float32)
    logits = head.forward(Batch.window(0, 0, 3), np.asarray([4, 5, 6]), hidden, np.arange(3))
    assert logits.shape == (3, SHAPE["vocab_size"]) and np.abs(backend.kv_k[-1][0, :, :3]).sum()
    w = model.w
    e = backend.rms_norm(w["embed_tokens"][[4, 5, 6]], w["mtp.pre_fc_norm_embedding"], 1e-6)
    h = backend.rms_norm(hidden, w["mtp.pre_fc_norm_hidden"], 1e-6)
    fc = w["mtp.fc"]
    H = SHAPE["hidden_size"]
    np.testing.assert_allclose(
        backend.concat_cols(e, h) @ fc.T, e @ fc[:, :H].T + h @ fc[:, H:].T, rtol=1e-4, atol=1e-5
    )


def test_resumed_chat_drafts_the_plain_reply(mtp_dir, plain):
    """The second turn resumes from the prompt cache (its saved state holds the head's KV
    layer too) and still gives the plain reply."""
    follow = prompt() + plain[:20] + prompt(9, seed=5)
    short = GenerationParams(max_new_tokens=24, greedy=True)
    want = reply(load(mtp_dir), follow, short)
    engine = load(mtp_dir, "2")
    reply(engine, prompt())
    assert engine.prompt_cache.lookup(follow) is not None
    assert reply(engine, follow, short) == want


def test_sampled_replies_draft_and_repeat_with_a_seed(mtp_dir):
    params = GenerationParams(max_new_tokens=24, temperature=0.8, top_k=40, top_p=0.95, seed=11)
    engine = load(mtp_dir, "2")
    first = reply(engine, prompt(), params)
    engine.prompt_cache.clear()
    assert reply(engine, prompt(), params) == first
    assert engine.drafter.stats.drafted > 0 and all(0 <= t < 512 for t in first)


def test_checkpoints_without_mtp_say_why(tmp_path):
    hf = write_checkpoint(tmp_path / "hf", SHAPE, "bf16", seed=3, mtp=False)
    write_tokenizer(hf)
    engine = load(hf, "2")
    assert engine.drafter is None
    assert engine.drafting.startswith("drafting is unavailable: the checkpoint has no mtp.*")
    mlx = write_checkpoint(tmp_path / "mlx", SHAPE, "mlx4", seed=3)
    write_tokenizer(mlx)
    engine = load(mlx, "auto")
    assert engine.drafter is None and "MLX conversions drop them" in engine.drafting
    with pytest.raises(ValueError, match="sanitize"):
        write_checkpoint(tmp_path / "x", SHAPE, "mlx4", mtp=True)


def test_mlx_lm_conversion_drops_the_head_the_hf_build_keeps(tiny_checkpoint):
    """The tiny builders: the HF one writes the 15 mtp.* tensors, mlx-lm's convert drops
    them (its sanitize), so only the HF checkpoint can draft."""
    hf = Checkpoint.open(tiny_checkpoint("tied-l4-r1", "hf-fp32"))
    assert sum(n.startswith("mtp.") for n in hf.tensors) == 15
    assert unavailable_reason(checkpoint_specs(hf), hf.config) is None
    mlx = Checkpoint.open(tiny_checkpoint("tied-l4-r1", "mlx4-g64"))
    assert not any(n.startswith("mtp.") for n in mlx.tensors)
    assert "MLX conversions" in unavailable_reason(checkpoint_specs(mlx), mlx.config)


def test_cli_flag_drafts_the_same_tokens(mtp_dir, capsys):
    from engine.cli import main

    ids = ",".join(map(str, prompt(12)))
    base = ["generate", "--model", str(mtp_dir), "--prompt-ids", ids, "--max-new-tokens", "8"]
    base += ["--greedy", "--backend", "numpy", "--json"]
    assert main(base) == 0
    plain_out = json.loads(capsys.readouterr().out)
    assert main([*base, "--draft-tokens", "3"]) == 0
    drafted = json.loads(capsys.readouterr().out)
    assert drafted["output_ids"] == plain_out["output_ids"]
    assert drafted["drafting"] == "drafts 3 tokens a step with the MTP head"


def test_env_sets_the_draft_tokens():
    from engine.errors import ConfigError

    assert EngineSettings.from_env({"SNUG_DRAFT_TOKENS": "auto"}).draft_max == 3
    assert EngineSettings.from_env({"SNUG_DRAFT_TOKENS": "0"}).draft_tokens == "off"
    assert EngineSettings(draft_tokens=2).draft_max == 2
    with pytest.raises(ConfigError, match="SNUG_DRAFT_TOKENS"):
        EngineSettings.from_env({"SNUG_DRAFT_TOKENS": "4"})


def test_auto_drafts_only_where_the_measured_rounds_pay():
    """ "auto" weighs the tokens a round is expected to give against its cost measured at
    load: at the H200's measured verify (3.6 to 3.8 steps a round) it decodes plainly; at
    the targets (1.15, 1.25, 1.35 steps) it drafts."""
    from engine.drafting import DraftPolicy

    slow = DraftPolicy(3, True, 0.05, {1: 3.75, 2: 3.62, 3: 3.74})
    fast = DraftPolicy(3, True, 0.05, {1: 1.15, 2: 1.25, 3: 1.35})
    for policy in (slow, fast):
        policy.tried, policy.kept = 100.0, 85.0
    assert slow.next() == 0 and fast.next() == 3
    fixed = DraftPolicy(2, False, 0.05, {1: 9.0, 2: 9.0})
    assert fixed.next() == 2  # a fixed count is the setting's, whatever it costs
    # A sampled reply's rounds wait for each draft: their own measured cost decides.
    both = DraftPolicy(3, True, 0.05, {1: 1.15, 2: 1.25, 3: 1.35}, {1: 3.0, 2: 3.5, 3: 4.0})
    both.tried, both.kept = 100.0, 85.0
    assert both.next(sampled=False) == 3 and both.next(sampled=True) == 0


def test_auto_measures_each_rounds_cost_at_load(mtp_dir):
    engine = load(mtp_dir, "auto")
    policy = engine.drafter.policy
    for costs in (policy.round_costs, policy.sampled_costs):
        assert sorted(costs) == [1, 2, 3] and all(c > 0 for c in costs.values())
    assert engine.drafter.stats.rounds == 0  # measured on slot 0, nothing counted
