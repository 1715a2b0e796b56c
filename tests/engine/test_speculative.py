"""Speculative sampling keeps the model's distribution; greedy keeps its picks; "auto"
drafts by the acceptance it sees."""

from __future__ import annotations

import numpy as np
import pytest

from engine.drafting import PROBE_EVERY, DraftPolicy
from engine.sampling import Sampler, SamplingParams
from engine.speculative import accept_greedy, accept_sampled, draw, residual

TRIALS = 60_000


def close_to(freq: np.ndarray, p: np.ndarray, n: int) -> bool:
    """Every frequency within 5 standard errors of p (a fixed seed: not flaky)."""
    return bool(np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12))


def test_greedy_keeps_the_drafts_the_model_picks():
    assert accept_greedy([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]  # all kept, one more
    assert accept_greedy([4, 5, 6], [4, 9, 6, 7]) == [4, 9]  # the model's pick replaces
    assert accept_greedy([4, 5], [8, 5, 6]) == [8]
    assert accept_greedy([], [3]) == [3]
    with pytest.raises(ValueError):
        accept_greedy([4, 5], [4, 5])


def test_residual_is_the_normalised_excess():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.5, 0.3])
    np.testing.assert_allclose(residual(p, q), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(residual(p, p), p)  # nothing in excess: p itself


def test_two_sampled_drafts_keep_the_joint_distribution():
    """Drafts from q, verified against p, give tokens distributed as p at each position
    (p here independent of the prefix: the joint is p1 x p2); keeping the drafts as drawn
    would give q1 x q2, which the same check tells apart."""
    rng = np.random.default_rng(7)
    p1, p2, p3 = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.2, 0.7]), np.array([0.3, 0.3, 0.4])
    q1, q2 = np.array([0.2, 0.3, 0.5]), np.array([0.5, 0.4, 0.1])
    joint = np.zeros((3, 3))
    naive = np.zeros((3, 3))
    for _ in range(TRIALS):
        d = [draw(q1, rng), draw(q2, rng)]
        out = accept_sampled(d, [p1, p2, p3], [q1, q2], rng)
        if len(out) == 1:  # the first draft rejected: the second token is drawn from p2
            out.append(draw(p2, rng))
        joint[out[0], out[1]] += 1
        naive[d[0], d[1]] += 1
    want = np.outer(p1, p2).ravel()
    assert close_to(joint.ravel() / TRIALS, want, TRIALS)
    assert not close_to(naive.ravel() / TRIALS, want, TRIALS)


def test_the_sampler_distribution_is_what_it_draws_from():
    params = SamplingParams(temperature=0.7, top_k=3, top_p=0.9, presence_penalty=0.5, seed=2)
    logits = np.random.default_rng(3).standard_normal(12).astype(np.float32)
    sampler = Sampler(params, vocab_rows=10)
    p = sampler.distribution(logits, generated=[1, 2])
    assert p.shape == (10,) and np.isclose(p.sum(), 1) and np.count_nonzero(p) <= 3
    counts = np.bincount([sampler(logits, [1, 2]) for _ in range(20_000)], minlength=10)
    assert close_to(counts / 20_000, p, 20_000)
    greedy = Sampler(SamplingParams(greedy=True), vocab_rows=10).distribution(logits)
    assert greedy[np.argmax(logits[:10])] == 1.0 and greedy.sum() == 1.0


def test_auto_drafts_more_as_more_drafts_are_kept():
    policy = DraftPolicy(3, auto=True, draft_cost=0.1)
    for _ in range(30):
        policy.record(3, 3)
    assert policy.next() == 3 and policy.rate > 0.9
    for _ in range(60):
        policy.record(3, 0)
    assert policy.rate < 0.1
    picks = [policy.next() for _ in range(PROBE_EVERY + 1)]
    assert picks[:-1] == [0] * PROBE_EVERY and picks[-1] == 1  # off, then one probe
    assert DraftPolicy(2, auto=False, draft_cost=5.0).next() == 2  # a fixed count stays
