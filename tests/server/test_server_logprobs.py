"""`logprobs` on chat and completions, as the openai client reads them: each token of the
reply with its log-probability, its bytes and the likeliest alternatives; streamed, the
same entries spread over the chunks."""

from __future__ import annotations

import math

import pytest

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def chat(served, **kw):
    return served.client().chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "Say something"}],
        max_tokens=kw.pop("max_tokens", 12),
        extra_body=NO_THINKING,
        **kw,
    )


def test_chat_gives_every_token_its_log_probability_and_alternatives(served):
    reply = chat(served, temperature=0, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    content = choice.logprobs.content
    ends = 0 if choice.finish_reason == "length" else 1  # the end-of-sequence token
    assert len(content) == reply.usage.completion_tokens - ends > 0
    # The bytes spell the reply (a random model may end a character early: up to there).
    text = b"".join(bytes(e.bytes) for e in content).decode("utf-8", errors="replace")
    assert text.startswith(choice.message.content.split("\ufffd")[0])
    assert "\ufffd" in text or text == choice.message.content
    for e in content:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        # greedy: the token is its step's likeliest
        assert e.top_logprobs[0].token == e.token and e.logprob == pytest.approx(tops[0])
    assert chat(served, temperature=0).choices[0].logprobs is None


def test_sampled_tokens_have_their_own_log_probabilities(served):
    content = chat(served, temperature=1.0, seed=5, logprobs=True).choices[0].logprobs.content
    assert content and all(e.top_logprobs == [] and e.logprob <= 0 for e in content)
    assert all(math.isfinite(e.logprob) for e in content)


def test_a_stream_spreads_the_same_entries_over_its_chunks(served):
    whole = chat(served, temperature=0, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    stream = chat(served, temperature=0, logprobs=True, top_logprobs=2, stream=True)
    parts = [
        e
        for c in stream
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in parts] == [(e.token, e.logprob) for e in whole]


def test_completions_give_tokens_offsets_and_alternatives(served):
    reply = served.client().completions.create(
        model=served.model, prompt="Once upon a time", max_tokens=10, temperature=0, logprobs=2
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    if "\ufffd" not in "".join(lp.tokens):
        assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == sorted(lp.text_offset)
    for token, at in zip(lp.tokens, lp.text_offset, strict=True):
        assert "\ufffd" in token or choice.text[at:].startswith(token)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2 and max(top.values()) == pytest.approx(value)
        assert top.get(token) == pytest.approx(value)


def test_logit_bias_and_frequency_penalty_change_the_reply(served):
    """`logit_bias` (+100 all but forces a token, -100 bars it) and `frequency_penalty`
    (less of a token each time the reply repeats it) reach the sampler; ids outside the
    vocabulary and keys that are not ids are refused by name."""
    tok = served.engine.tokenizer
    forced = tok.encode("a")[0]
    reply = chat(served, temperature=0, max_tokens=6, logit_bias={str(forced): 100})
    assert reply.choices[0].message.content == tok.decode([forced] * 6)
    plain = chat(served, temperature=0, max_tokens=24, logprobs=True, top_logprobs=2).choices[0]
    said = [e.token for e in plain.logprobs.content]
    assert len(set(said)) < len(said)  # greedy repeats itself: something to penalise
    first = plain.logprobs.content[0]
    barred = chat(served, temperature=0, max_tokens=1, logprobs=True, top_logprobs=2,
                  logit_bias={str(tok.encode(first.token)[0]): -100})  # fmt: skip
    assert barred.choices[0].logprobs.content[0].token == first.top_logprobs[1].token
    penalised = chat(served, temperature=0, max_tokens=24, frequency_penalty=2.0)
    assert penalised.choices[0].message.content != plain.message.content
    import openai

    for bias, says in (({"99999999": 5}, "outside"), ({"x": 5}, "token id"),
                       ({"3": 500}, "must be in")):  # fmt: skip
        with pytest.raises(openai.BadRequestError, match=says) as err:
            chat(served, logit_bias=bias)
        assert err.value.body["param"].startswith("logit_bias")
