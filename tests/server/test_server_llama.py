"""llama.cpp's own completion API (`POST /completion`, `GET /props`): the reply is the one
the engine gives the same prompt alone, in llama.cpp's shape, whole or streamed; its stop
words, token probabilities, token ids and JSON schema; what it cannot take refused by
name."""

from __future__ import annotations

import json

import httpx

from engine.session import GenerationParams
from tests.server.conftest import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The capital of France is"


def post(served, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{served.base}/completion", json=body, headers=AUTH, timeout=60, **kw)


def alone(solo, prompt: str, n: int) -> str:
    engine = solo.engine
    ids = engine.tokenizer.encode(prompt)
    params = GenerationParams(max_new_tokens=n, greedy=True)
    return "".join(e.text for e in engine.generate(ids, params))


def test_the_reply_is_the_engines_in_llama_cpps_shape(served, solo):
    expected = alone(solo, PROMPT, 8)
    got = post(served, {"prompt": PROMPT, "n_predict": 8, "temperature": 0})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["content"] == expected and body["stop"] is True
    ids = served.engine.tokenizer.encode(PROMPT)
    assert body["tokens_evaluated"] == len(ids) and body["tokens_predicted"] <= 8
    assert body["stop_type"] in ("limit", "eos") and body["stopping_word"] == ""
    if body["stop_type"] == "limit":
        assert body["tokens_predicted"] == 8
    assert body["generation_settings"]["n_ctx"] == served.engine.context
    assert body["timings"]["predicted_n"] == body["tokens_predicted"]
    assert body["tokens"] == [] and body["has_new_line"] == ("\n" in expected)
    # The same prompt as token ids, and the reply's own ids where asked.
    again = post(served, {"prompt": ids, "n_predict": 8, "temperature": 0, "return_tokens": True})
    tokens = again.json()["tokens"]
    assert again.json()["content"] == expected and len(tokens) == body["tokens_predicted"]
    assert served.engine.tokenizer.decode(tokens).startswith(expected)
    served.wait_idle()


def test_a_streamed_reply_and_its_last_event(served, solo):
    expected = alone(solo, PROMPT, 8)
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{served.base}/completion", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == expected
    assert events[-1]["content"] == "" and events[-1]["stop_type"] in ("limit", "eos")
    served.wait_idle()


def test_stop_words_probabilities_and_a_schema(served, solo):
    expected = alone(solo, PROMPT, 12)
    word = expected.strip()[1:3]
    if len(word) < 2 or word not in expected:
        word = expected[-2:]
    got = post(served, {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "stop": [word]})
    body = got.json()
    assert body["stop_type"] == "word" and body["stopping_word"] == word
    assert body["content"] == expected[: expected.index(word)]
    probs = post(served, {"prompt": PROMPT, "n_predict": 4, "temperature": 0, "n_probs": 3})
    body = probs.json()
    entries = body["completion_probabilities"]
    assert len(entries) == body["tokens_predicted"]
    assert all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in entries)
    assert all(isinstance(e["id"], int) and "id" in e["top_logprobs"][0] for e in entries)
    schema = {"type": "string", "enum": ["yes", "no"]}
    held = post(served, {"prompt": PROMPT, "n_predict": 32, "json_schema": schema})
    assert json.loads(held.json()["content"]) in ("yes", "no")
    served.wait_idle()


def test_props_and_what_is_refused(served):
    props = httpx.get(f"{served.base}/props", headers=AUTH, timeout=30).json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == served.engine.context
    assert props["total_slots"] == served.engine.streams and props["chat_template"]
    for body, name in (
        ({"prompt": PROMPT, "grammar": "root ::= [a-z]+"}, "grammar"),
        ({"prompt": PROMPT, "n_predict": -2}, "n_predict"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": PROMPT, "logit_bias": "x"}, "logit_bias"),
    ):
        got = post(served, body)
        assert got.status_code == 400 and got.json()["error"]["param"] == name, got.text
    # `false` bars a token: the greedy reply's first token, barred, is not its first
    plain = {"prompt": PROMPT, "n_predict": 2, "temperature": 0, "return_tokens": True}
    first = post(served, plain).json()["tokens"][0]
    barred = post(served, {**plain, "logit_bias": [[first, False]]})
    assert barred.status_code == 200 and barred.json()["tokens"][0] != first
    served.wait_idle()


def test_n_predict_past_the_context_runs_until_it_is_full(served, solo):
    """As llama.cpp's server: a count past the context's room is no error, the reply ends
    where the context does (or at its end of sequence)."""
    got = post(served, {"prompt": PROMPT, "n_predict": 10**6, "temperature": 0, "ignore_eos": True})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["tokens_evaluated"] + body["tokens_predicted"] <= served.engine.context
    assert body["stop_type"] == "limit"
