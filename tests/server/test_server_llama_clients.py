"""llama.cpp's server API as its own web UI, editor plugins and scripts call it, beyond a
plain completion: `/tokenize` with `parse_special`, `/completion` with `n_predict` 0 (the
prompt read into the cache, nothing written) and the token ids of a streamed reply."""

from __future__ import annotations

import json

import httpx

from tests.server.conftest import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}


def post(served, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.base}{route}", json=body, headers=AUTH, timeout=60)


def test_tokenize_reads_special_tokens_as_text_where_asked(served):
    """`parse_special: false` (llama.cpp's) reads a special token's text as plain text;
    true, or left out, reads it as the token."""
    tok = served.engine.tokenizer
    text = "say <|im_start|> then <|im_end|>"
    special = {tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")}
    parsed = post(served, "/tokenize", {"content": text}).json()["tokens"]
    assert parsed == tok.encode(text) and special <= set(parsed)
    assert post(served, "/tokenize", {"content": text, "parse_special": True}).json() == {
        "tokens": parsed
    }
    plain = post(served, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert not special & set(plain) and len(plain) > len(parsed)
    assert tok.decode(plain) == text
    pieces = post(served, "/tokenize", {"content": text, "parse_special": False,
                                        "with_pieces": True}).json()["tokens"]  # fmt: skip
    assert [p["id"] for p in pieces] == plain
    assert tok.encode(text) == parsed  # the shared tokenizer still reads them as tokens
    bad = post(served, "/tokenize", {"content": text, "parse_special": "no"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "parse_special"


def test_n_predict_0_reads_the_prompt_into_the_cache_and_writes_nothing(served):
    """As llama.cpp documents it: `n_predict: 0` writes no token but reads the prompt into
    the cache (clients warm it before they ask), so the same prompt then starts from it."""
    prompt = "A prompt read ahead of its question, then asked:"
    ids = served.engine.tokenizer.encode(prompt)
    got = post(served, "/completion", {"prompt": prompt, "n_predict": 0, "return_tokens": True})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["content"] == "" and body["tokens"] == [] and body["stop"] is True
    assert body["tokens_predicted"] == 0 and body["tokens_evaluated"] == len(ids)
    assert body["stop_type"] == "limit" and body["timings"]["predicted_n"] == 0
    assert body["generation_settings"]["n_predict"] == 0
    then = post(served, "/completion", {"prompt": prompt, "n_predict": 2, "temperature": 0})
    assert then.json()["tokens_cached"] == len(ids)
    stream = {"prompt": prompt, "n_predict": 0, "stream": True, "n_probs": 2}
    with httpx.stream("POST", f"{served.base}/completion", json=stream, headers=AUTH) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert len(events) == 1 and events[0]["stop"] is True and events[0]["content"] == ""
    assert events[0]["completion_probabilities"] == [] and events[0]["tokens_predicted"] == 0
    served.wait_idle()


def test_a_streamed_reply_gives_its_token_ids_with_its_text(served):
    """llama.cpp fills a streamed event's `tokens` with the ids of the text it carries
    (`return_tokens` or not): together they are the reply's tokens, as the whole reply
    gives them with `return_tokens`."""
    body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}
    whole = post(served, "/completion", {**body, "return_tokens": True}).json()
    with httpx.stream("POST", f"{served.base}/completion", json={**body, "stream": True},
                      headers=AUTH) as r:  # fmt: skip
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    ids = [t for e in events[:-1] for t in e["tokens"]]
    ends = set(served.engine.eos_ids)
    assert ids and ids == [t for t in whole["tokens"] if t not in ends]
    assert "".join(e["content"] for e in events) == whole["content"]
    served.wait_idle()


def test_props_gives_the_sampling_a_completion_takes_by_default(served):
    """Clients read the server's sampling defaults from `/props`
    (`default_generation_settings.params`) to show or keep them: they are those a
    `/completion` that names none runs with."""
    props = httpx.get(f"{served.base}/props", headers=AUTH, timeout=30).json()
    params = props["default_generation_settings"]["params"]
    got = post(served, "/completion", {"prompt": "The capital of France is", "n_predict": 2})
    used = got.json()["generation_settings"]
    for name in ("temperature", "top_k", "top_p", "min_p", "seed", "stop"):
        assert params[name] == used[name], name
    assert params["n_predict"] == -1 and params["presence_penalty"] == 0
    assert params["frequency_penalty"] == 0
    served.wait_idle()
