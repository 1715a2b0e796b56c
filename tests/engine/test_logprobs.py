"""Token log-probabilities (GenerationParams.logprobs): the model's own distribution at each
step, from the logits on the host; a request that asks for them picks there, like one held
to a grammar, and leaves the others' picks alone."""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.errors import SnugError
from engine.sampling import Sampler, SamplingParams, token_logprobs
from engine.session import Engine, GenerationParams

NUMPY = EngineSettings(backend="numpy")


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - np.log(np.sum(np.exp(x - x.max()))) - x.max()


def test_the_values_are_a_log_softmax_over_the_real_vocabulary():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(300).astype(np.float32) * 4
    logits[290:] = 50.0  # padding columns: never counted
    logits[[3, 7]] = logits[:290].max() + 1  # a tie at the top: the lower id first
    want = log_softmax(logits[:290])
    got = token_logprobs(logits, 11, 5, 290)
    assert got.logprob == pytest.approx(want[11], abs=1e-12)
    order = np.argsort(-want, kind="stable")[:5]
    assert [i for i, _ in got.top] == order.tolist() and got.top[0][0] == 3
    assert [v for _, v in got.top] == pytest.approx(want[order].tolist(), abs=1e-12)
    assert token_logprobs(logits, 11, 0, 290).top == ()


def test_a_sampler_that_keeps_logprobs_picks_on_the_host():
    greedy = SamplingParams(greedy=True)
    plain, kept = Sampler(greedy, 300), Sampler(greedy, 300, logprobs=2)
    assert plain.takes_argmax and not kept.takes_argmax and not kept.on_device and kept.host_only
    logits = np.random.default_rng(1).standard_normal(300).astype(np.float32)
    token = kept(logits)
    assert token == plain(logits) == int(np.argmax(logits))
    assert kept.last is not None and kept.last.top[0][0] == token and plain.last is None
    with pytest.raises(SnugError, match="at most 20"):
        GenerationParams(logprobs=21)


def test_each_event_carries_the_log_probability_the_prompt_gives_its_token(tiny_checkpoint):
    """Greedy: each token is its step's likeliest, and the first one's log-probability is
    the log-softmax of the prompt's last logits from a separate engine's prefill."""
    path = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    prompt = [5, 17, 42, 9, 100, 3]
    engine = Engine.load(path, NUMPY, context=256, max_rows=64)
    params = GenerationParams(max_new_tokens=6, greedy=True, logprobs=3)
    events = list(engine.generate(prompt, params))
    greedy = GenerationParams(max_new_tokens=6, greedy=True)
    plain = [e.token_id for e in engine.generate(prompt, greedy)]
    assert [e.token_id for e in events] == plain  # asking for them changes no pick
    for e in events:
        assert e.logprobs is not None and len(e.logprobs.top) == 3
        assert e.logprobs.top[0] == (e.token_id, e.logprobs.logprob) and e.logprobs.logprob <= 0
    other = Engine.load(path, NUMPY, context=256, max_rows=64)
    stream = other._open_stream()
    try:
        logits = other.prefill(stream, prompt)
    finally:
        other._close_stream(stream)
    want = log_softmax(np.asarray(logits)[: engine.vocab_rows])
    assert events[0].logprobs.logprob == pytest.approx(want[events[0].token_id], abs=1e-5)
    unasked = engine.generate(prompt, GenerationParams(max_new_tokens=3))
    assert all(e.logprobs is None for e in unasked)


def test_token_bytes_spell_the_text_even_inside_a_character(tmp_path):
    """Byte-level pieces give their bytes (a piece of a character included); an added
    token, its text."""
    from engine.testing.tiny import write_tokenizer
    from engine.tokenizer import Tokenizer

    write_tokenizer(tmp_path)
    tok = Tokenizer.load(tmp_path)
    for text in ("Hello world", "héllo 日本 🎉", "<|im_end|>"):
        ids = tok.encode(text)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    parts = [tok.token_bytes(i) for i in tok.encode("🎉")]
    assert len(parts) > 1  # a character cut into pieces, each with its own bytes
