import numpy as np
import pytest

from engine.errors import SnugError
from engine.sampling import Sampler, SamplingParams

REAL = 90  # columns 90..99 are vocabulary padding


def logits(seed=0, size=100):
    x = np.random.default_rng(seed).normal(size=size).astype(np.float32)
    x[REAL:] = 50.0  # padding rows are the largest: they must still never be picked
    return x


def test_greedy_ignores_padding_rows():
    x = logits()
    token = Sampler(SamplingParams(greedy=True), REAL)(x)
    assert token == int(np.argmax(x[:REAL]))


def test_temperature_zero_is_greedy():
    x = logits(1)
    assert Sampler(SamplingParams(temperature=0.0), REAL)(x) == int(np.argmax(x[:REAL]))


def test_padding_never_sampled_at_high_temperature():
    sampler = Sampler(SamplingParams(temperature=5.0, top_k=0, top_p=1.0, seed=3), REAL)
    picks = {sampler(logits(s)) for s in range(300)}
    assert max(picks) < REAL


def test_seed_reproduces_and_differs():
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=7)
    a = [Sampler(p, REAL)(logits(s)) for s in range(20)]
    b = [Sampler(p, REAL)(logits(s)) for s in range(20)]
    assert a == b
    runs = {
        tuple(
            Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=k), REAL)(logits(0))
            for _ in range(1)
        )
        for k in range(30)
    }
    assert len(runs) > 1


def test_top_k_restricts_choices():
    x = logits(2)
    allowed = set(np.argsort(-x[:REAL])[:3].tolist())
    sampler = Sampler(SamplingParams(temperature=3.0, top_k=3, top_p=1.0, seed=0), REAL)
    assert {sampler(x) for _ in range(200)} <= allowed


def test_top_p_keeps_smallest_prefix():
    x = np.full(100, -30.0, np.float32)
    x[[5, 6, 7]] = [3.0, 2.0, 1.0]  # probabilities ~0.665, 0.245, 0.090
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.8, seed=0), REAL)
    assert {sampler(x) for _ in range(300)} == {5, 6}


def test_min_p_drops_unlikely_tokens():
    x = np.full(100, -30.0, np.float32)
    x[[1, 2]] = [2.0, 0.0]  # p(2)/p(1) = e^-2 ~ 0.135
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=0), REAL)
    assert {sampler(x) for _ in range(200)} == {1}


def test_presence_penalty_moves_greedy_choice():
    x = np.zeros(100, np.float32)
    x[4], x[9] = 1.0, 0.5
    sampler = Sampler(SamplingParams(greedy=True, presence_penalty=1.0), REAL)
    assert sampler(x, generated=[]) == 4
    assert sampler(x, generated=[4, 4]) == 9


def test_the_penalties_count_the_replys_earlier_part():
    """A reply gone on with in a second request (its thinking closed at a budget) counts
    what came before, on the host and in the device draw's first marks, as one reply would."""
    x = np.zeros(100, np.float32)
    x[4], x[9] = 1.0, 0.5
    sampler = Sampler(SamplingParams(greedy=True, presence_penalty=1.0, earlier=(4,)), REAL)
    assert sampler(x, generated=[]) == 9
    freq = Sampler(SamplingParams(greedy=True, frequency_penalty=0.3, earlier=(4, 4)), REAL)
    assert freq(x, generated=[]) == 9 and freq(x, generated=[9]) == 4
    first = sampler.device_draw([7], slot=0)
    assert first.clear and first.mark == (4, 7)
    after = sampler.device_draw([7, 8], slot=0)  # 8 was the first draw's, marked by it
    assert not after.clear and after.mark == ()
    plain = Sampler(SamplingParams(greedy=True, earlier=(4,)), REAL)  # no penalty: no effect
    assert plain(x, generated=[]) == 4 and plain.takes_argmax


def test_frequency_penalty_counts_each_time_a_token_was_said():
    """Unlike the presence penalty, the frequency penalty grows with each repeat; both are
    made on the host (the decode step's argmax and the device's draw do neither)."""
    x = np.zeros(100, np.float32)
    x[4], x[9] = 1.0, 0.5
    sampler = Sampler(SamplingParams(greedy=True, frequency_penalty=0.3), REAL)
    assert sampler(x, generated=[4]) == 4  # 1.0 - 0.3 > 0.5
    assert sampler(x, generated=iter([4, 4])) == 9  # 1.0 - 0.6 < 0.5; an iterator too
    assert sampler(x, generated=[4, 4, 9, 9, 9]) == 4
    assert not sampler.takes_argmax and not sampler.on_device and sampler.host_only


def test_logit_bias_bars_and_favours_tokens():
    x = np.zeros(100, np.float32)
    x[4] = 3.0
    barred = Sampler(SamplingParams(greedy=True, logit_bias=((4, -100.0),)), REAL)
    assert barred(x) != 4 and not barred.on_device and not barred.takes_argmax
    favoured = Sampler(SamplingParams(temperature=1.0, seed=1, logit_bias=((7, 100.0),)), REAL)
    assert {favoured(x) for _ in range(50)} == {7}
    # An id past the real vocabulary (padding) stays out of reach whatever its bias.
    padded = Sampler(SamplingParams(greedy=True, logit_bias=((REAL + 1, 100.0),)), REAL)
    assert padded(np.zeros(REAL + 8, np.float32)) < REAL


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": -2},
        {"min_p": 1.5},
        {"logit_bias": ((-1, 1.0),)},
    ],
)
def test_bad_settings_are_named(kwargs):
    with pytest.raises(SnugError, match=list(kwargs)[0]):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-30])
def test_a_temperature_near_zero_is_greedy_among_the_maxima(temperature):
    x = logits(3)
    best = int(np.argmax(x[:REAL]))
    for top_k, top_p in ((20, 0.8), (0, 1.0)):
        sampler = Sampler(SamplingParams(temperature, top_k, top_p, seed=0), REAL)
        assert sampler(x) == best
        dist = sampler.distribution(x)
        assert dist[best] == 1.0 and dist.sum() == 1.0
    x[7] = x[best]  # two maxima: an even draw between them
    sampler = Sampler(SamplingParams(temperature, seed=0), REAL)
    assert {sampler(x) for _ in range(60)} == {7, best}
    assert sampler.distribution(x)[[7, best]].tolist() == [0.5, 0.5]


@pytest.mark.parametrize(
    ("kwargs", "generated", "allowed"),
    [
        ({"presence_penalty": 1e39}, [4], None),
        ({"presence_penalty": -1e39}, [4, 9], {4, 9}),  # both raised as far as float32 goes
        ({"frequency_penalty": 1e38}, [4] * 10, None),
        ({"frequency_penalty": -1e300}, [4, 9, 9], {4, 9}),
        ({"logit_bias": ((3, 1e300), (5, float("inf")))}, [], {3, 5}),
        ({"logit_bias": ((3, -float("inf")),)}, [], None),
    ],
)
def test_huge_penalties_and_biases_give_no_nan(kwargs, generated, allowed):
    x = logits(4)
    for temperature in (0.7, 1e-310, 0.0):
        sampler = Sampler(SamplingParams(temperature=temperature, seed=1, **kwargs), REAL)
        picks = {sampler(x, generated) for _ in range(40)}
        dist = sampler.distribution(x, generated)
        assert np.isfinite(dist).all() and abs(dist.sum() - 1.0) < 1e-12
        if allowed is not None:
            assert picks <= allowed
        else:
            assert not picks & {4, 3}


def test_ordinary_draws_keep_their_probabilities():
    """Where x / temperature does not overflow, the probabilities are those of the softmax
    of the top-k scores at the temperature, to the bit (the seeded draws stay the same)."""
    x = logits(5)
    for temperature in (0.01, 0.7, 1.3):
        sampler = Sampler(SamplingParams(temperature=temperature, top_k=20, top_p=1.0), REAL)
        top = np.flatnonzero(x[:REAL] >= np.partition(x[:REAL], -20)[-20])
        scaled = x[top].astype(np.float64) / temperature
        want = np.exp(scaled - scaled.max())
        want /= want.sum()
        want /= want.sum()  # twice, as the sampler normalises after its cuts again
        np.testing.assert_array_equal(sampler.distribution(x)[top], want)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": float("inf")},
        {"temperature": float("nan")},
        {"presence_penalty": float("nan")},
        {"presence_penalty": float("-inf")},
        {"frequency_penalty": float("inf")},
        {"logit_bias": ((3, float("nan")),)},
    ],
)
def test_settings_that_are_not_numbers_are_named(kwargs):
    with pytest.raises(SnugError, match=list(kwargs)[0]):
        SamplingParams(**kwargs)


def test_a_huge_presence_penalty_reaches_the_device_within_float32():
    for penalty, want in ((1e39, np.finfo(np.float32).max), (-1e300, -np.finfo(np.float32).max)):
        draw = Sampler(SamplingParams(presence_penalty=penalty), REAL).device_draw([4], 0)
        assert draw.penalty == float(want) and np.isfinite(np.float32(draw.penalty))
    assert Sampler(SamplingParams(presence_penalty=1.5), REAL).device_draw([4], 0).penalty == 1.5
