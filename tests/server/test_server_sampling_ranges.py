"""Sampling values at the edges of each API's range. `top_p: 0` is in OpenAI's range
([0, 1], as its API reference gives it) and Anthropic's, and Ollama's and llama.cpp's
samplers take it: the nucleus shrinks to the single likeliest token, so the reply is the
greedy one. Ollama's `options.temperature` has no upper bound (its sampler scales by any
temperature; a negative one is 0, greedy) and a `top_p` past 1 is 1 (off), as
ollama/sample/samplers.go clamps them; OpenAI's API still holds temperature to [0, 2]."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import KEY, serve
from tests.server.test_server_sampling_defaults import Recording

HEADERS = {"Authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "Hi"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def recorded(tools_checkpoint):
    s = serve(tools_checkpoint, Recording)
    yield s
    s.server.stop()
    s.scheduler.close()


def post(served, path: str, **body) -> httpx.Response:
    return httpx.post(served.base + path, json=body, headers=HEADERS, timeout=60)


def test_top_p_zero_picks_the_likeliest_token(recorded):
    client = recorded.client()
    ask = dict(model=recorded.model, messages=USER, max_tokens=12, extra_body=OFF)
    greedy = client.chat.completions.create(temperature=0, **ask).choices[0].message.content
    nucleus = client.chat.completions.create(temperature=1.0, top_p=0, seed=3, **ask)
    assert nucleus.choices[0].message.content == greedy
    params = recorded.scheduler.seen[-1]
    assert (params.top_k, params.top_p) == (1, 1.0)  # one candidate: the likeliest


def test_openai_still_holds_temperature_to_two(recorded):
    body = {"model": recorded.model, "messages": USER, "temperature": 2.5}
    r = httpx.post(recorded.url + "/chat/completions", json=body, headers=HEADERS)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"


@pytest.mark.parametrize("raw", [False, True])
def test_ollama_takes_temperature_and_top_p_as_its_sampler_does(recorded, raw):
    seen = recorded.scheduler.seen
    for options, expected in (
        ({"temperature": 5}, (5.0, None)),
        ({"temperature": -1}, (0.0, None)),
        ({"temperature": 0.5, "top_p": 1.5}, (0.5, 1.0)),
        ({"temperature": 3, "top_p": 0}, (3.0, 1.0)),
    ):
        r = post(recorded, "/api/generate", model=recorded.model, prompt="Hi", raw=raw,
                 stream=False, think=False, options={**options, "num_predict": 2})  # fmt: skip
        assert r.status_code == 200, (options, r.text)
        temperature, top_p = expected
        assert seen[-1].temperature == temperature, options
        if top_p is not None:
            assert seen[-1].top_p == top_p, options
        assert (seen[-1].top_k == 1) == (options.get("top_p") == 0), options
    r = post(recorded, "/api/chat", model=recorded.model, messages=USER, stream=False,
             think=False, options={"temperature": 4, "num_predict": 2})  # fmt: skip
    assert r.status_code == 200 and seen[-1].temperature == 4.0, r.text


def test_ollama_top_p_zero_is_the_greedy_reply(recorded):
    ask = dict(model=recorded.model, prompt="Once", raw=True, stream=False)
    greedy = post(recorded, "/api/generate", **ask, options={"temperature": 0, "num_predict": 10})
    hot = {"temperature": 7, "top_p": 0, "seed": 5, "num_predict": 10}
    nucleus = post(recorded, "/api/generate", **ask, options=hot)
    assert nucleus.status_code == 200, nucleus.text
    assert nucleus.json()["response"] == greedy.json()["response"]


@pytest.mark.parametrize("name", ["temperature", "top_p"])
def test_ollama_refuses_a_value_that_is_no_number(recorded, name):
    for raw in (False, True):
        r = post(recorded, "/api/generate", model=recorded.model, prompt="Hi", raw=raw,
                 options={name: "hot"})  # fmt: skip
        assert r.status_code == 400 and f"'options.{name}'" in r.json()["error"], r.text


def test_llama_cpp_takes_temperature_and_top_p_as_its_sampler_does(recorded):
    """llama.cpp's server reads `temperature` and `top_p` unchecked: its sampler scales by
    any temperature (none above 0: the likeliest token) and a top_p of 1 or more is off."""
    seen = recorded.scheduler.seen
    for sent, expected in (
        ({"temperature": 4}, (4.0, None)),
        ({"temperature": -0.5}, (0.0, None)),
        ({"temperature": 0.8, "top_p": 2}, (0.8, 1.0)),
    ):
        body = {"prompt": "Hi", "n_predict": 2, **sent}
        r = httpx.post(recorded.base + "/completion", json=body, headers=HEADERS, timeout=60)
        assert r.status_code == 200, (sent, r.text)
        temperature, top_p = expected
        assert seen[-1].temperature == temperature, sent
        if top_p is not None:
            assert seen[-1].top_p == top_p, sent
    r = httpx.post(recorded.base + "/completion", json={"prompt": "Hi", "temperature": "hot"},
                   headers=HEADERS)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text
