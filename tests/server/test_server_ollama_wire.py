"""Ollama's API on the wire, as its clients read it: the words of its errors, tool calls
with their `id` and `index`, `logprobs`, `think` levels, `keep_alive` (0: unload, refused
here by name), what `/api/generate` refuses as Ollama does, and the model's description in
`/api/tags`, `/api/ps` and `/api/show` with every field that Continue, Enchanted's
OllamaKit and the `ollama` client read."""

from __future__ import annotations

import json
import re
from datetime import datetime

import httpx
import numpy as np
import pytest

from tests.server.conftest import CONTEXT, KEY, PARIS_CALL, WEATHER_PARAMETERS

ollama = pytest.importorskip("ollama")

HEADERS = {"Authorization": f"Bearer {KEY}"}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}
HI = [{"role": "user", "content": "Hi"}]
# Times as OllamaKit (Enchanted) decodes them: "yyyy-MM-dd'T'HH:mm:ss.SSSSSSSSSZZZZZ", the
# fractional seconds required.
OLLAMAKIT_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+(Z|[+-]\d\d:\d\d)")
# How Continue reads each line of /api/show's `parameters` (a line that does not match
# ends its reading of them all).
CONTINUE_PARAMETER = re.compile(r'^(\S+)\s+((?:".*")|\S+)$')


def client(served):
    return ollama.Client(host=served.base, headers=HEADERS)


def post(served, path: str, **body) -> httpx.Response:
    return httpx.post(served.base + path, json=body, headers=HEADERS, timeout=30)


def lines(r: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def test_an_unknown_model_is_not_found_in_ollamas_words(served):
    """Ollama answers 404 "model 'NAME' not found" (front-ends show it, some offer to pull);
    /api/show without a model is a 400 "model is required"."""
    for path, body in (
        ("/api/chat", {"messages": HI}),
        ("/api/generate", {"prompt": "Hi"}),
        ("/api/generate", {"prompt": "Hi", "raw": True}),
        ("/api/show", {}),
    ):
        r = post(served, path, model="other", stream=False, **body)
        assert r.status_code == 404, path
        assert r.json()["error"].startswith("model 'other' not found"), path
        assert served.model in r.json()["error"]
    r = post(served, "/api/show")
    assert r.status_code == 400 and r.json() == {"error": "model is required"}


def test_tool_calls_carry_their_id_and_index(scripted):
    """Each call as Ollama gives it: `id` ("call_..."), and `function.index`, its place
    in the reply, whether the reply streams or not."""
    second = PARIS_CALL.split("I will check.\n\n")[1].replace("Paris", "Rome")
    body = {"model": scripted.model, "messages": HI, "tools": [WEATHER], "think": False}
    scripted.scheduler.say(PARIS_CALL + "\n" + second)
    whole = post(scripted, "/api/chat", stream=False, **body).json()
    calls = whole["message"]["tool_calls"]
    assert [c["function"]["index"] for c in calls] == [0, 1]
    assert [c["function"]["arguments"]["city"] for c in calls] == ["Paris", "Rome"]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert whole["done_reason"] == "stop"
    scripted.scheduler.say(PARIS_CALL + "\n" + second)
    streamed = lines(post(scripted, "/api/chat", stream=True, **body))
    calls = [c for line in streamed for c in line["message"].get("tool_calls", [])]
    assert [c["function"]["index"] for c in calls] == [0, 1]
    assert all(c["id"].startswith("call_") for c in calls)


def test_logprobs_come_with_the_tokens(served):
    """`logprobs` (and `top_logprobs`, 0 to 20) as Ollama answers them: one entry a token
    of the reply (not the end of sequence), each with its alternatives; streamed, the same
    entries with the lines that follow them; raw generate too."""
    c = client(served)
    greedy = {"temperature": 0, "num_predict": 12}
    ask = {"model": served.model, "messages": HI, "think": False, "options": greedy}
    reply = c.chat(**ask, logprobs=True, top_logprobs=2)
    ends = 0 if reply.done_reason == "length" else 1
    assert len(reply.logprobs) == reply.eval_count - ends > 0
    for lp in reply.logprobs:
        tops = [t.logprob for t in lp.top_logprobs]
        assert len(tops) == 2 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert lp.top_logprobs[0].token == lp.token  # greedy: the likeliest
    parts = list(c.chat(**ask, logprobs=True, top_logprobs=2, stream=True))
    streamed = [(lp.token, lp.logprob) for p in parts for lp in p.logprobs or []]
    assert streamed == [(lp.token, lp.logprob) for lp in reply.logprobs]
    assert c.chat(**ask).logprobs is None
    raw = c.generate(model=served.model, prompt="Once", raw=True, options=greedy, logprobs=True,
                     top_logprobs=1)  # fmt: skip
    assert len(raw.logprobs) == raw.eval_count - (0 if raw.done_reason == "length" else 1)
    assert all(len(lp.top_logprobs) == 1 for lp in raw.logprobs)
    r = post(served, "/api/chat", **ask, logprobs=True, top_logprobs=21)
    assert r.status_code == 400 and "top_logprobs" in r.json()["error"]


def test_think_takes_ollamas_levels_and_nothing_else(scripted):
    c = client(scripted)
    scripted.scheduler.say("Briefly.</think>\n\nHello.")
    reply = c.chat(model=scripted.model, messages=HI, think="max")
    assert reply.message.thinking == "Briefly." and reply.message.content == "Hello."
    r = post(scripted, "/api/chat", model=scripted.model, messages=HI, think="extreme")
    assert r.status_code == 400 and "think" in r.json()["error"]


def test_keep_alive_loads_and_an_unload_is_refused_by_name(scripted):
    """Nothing to answer loads the model (`done_reason` "load", messages left out too);
    with `keep_alive` 0 it asks for the model unloaded, which this server does not do
    while it runs: said, not answered as done. A reply with `keep_alive` 0 is answered."""
    m = scripted.model
    for path, body in (("/api/generate", {}), ("/api/chat", {}), ("/api/chat", {"messages": []})):
        r = post(scripted, path, model=m, keep_alive="5m", **body)
        assert r.status_code == 200 and r.json()["done_reason"] == "load", (path, body)
    for alive in (0, "0", "0s", "0m"):
        r = post(scripted, "/api/generate", model=m, keep_alive=alive)
        assert r.status_code == 400 and "stop the server" in r.json()["error"], alive
    r = post(scripted, "/api/chat", model=m, messages=[], keep_alive=0)
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as err:
        client(scripted).generate(model=m, keep_alive=0)  # `ollama stop`
    assert "stays loaded" in err.value.error
    scripted.scheduler.say("Hello.")
    reply = client(scripted).chat(model=m, messages=HI, think=False, keep_alive=0)
    assert reply.message.content == "Hello."
    scripted.scheduler.say("Hello.")
    r = post(scripted, "/api/chat", model=m, messages=HI, keep_alive="1h30m", stream=False)
    assert r.status_code == 200
    r = post(scripted, "/api/chat", model=m, messages=HI, keep_alive="soon")
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]


def test_generate_refuses_what_it_cannot_honour_as_ollama_does(scripted):
    """An empty prompt only loads (a system prompt or not); a `template` of Ollama's own
    kind, and a system prompt with `raw`, are refused by name rather than dropped."""
    m = scripted.model
    r = post(scripted, "/api/generate", model=m, system="Be brief.")
    assert r.json()["done"] is True and r.json()["done_reason"] == "load"
    r = post(scripted, "/api/generate", model=m, prompt="Hi", template="{{ .Prompt }}")
    assert r.status_code == 400 and "'template'" in r.json()["error"]
    r = post(scripted, "/api/generate", model=m, prompt="Hi", raw=True, system="Be brief.")
    assert r.status_code == 400 and "raw" in r.json()["error"]


def test_bodies_it_cannot_read_are_400s_that_say_why(served):
    """Not JSON, or images (a text model): 400, `{"error": message}`, as Ollama answers."""
    r = httpx.post(served.base + "/api/chat", content=b"{", headers=HEADERS)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    image = {"role": "user", "content": "What is this?", "images": ["aGk="]}
    r = post(served, "/api/chat", model=served.model, messages=[image])
    assert r.status_code == 400 and "images" in r.json()["error"]
    r = post(served, "/api/generate", model=served.model, prompt="What?", images=["aGk="])
    assert r.status_code == 400 and "'images'" in r.json()["error"]


def test_roles_are_read_as_ollama_reads_them(scripted):
    scripted.scheduler.say("Hello.")
    messages = [{"role": "System", "content": "Be brief."}, {"role": "USER", "content": "Hi"}]
    r = post(scripted, "/api/chat", model=scripted.model, messages=messages, think=False,
             stream=False)  # fmt: skip
    assert r.status_code == 200 and r.json()["message"]["content"] == "Hello."
    assert "<|im_start|>system\nBe brief.<|im_end|>" in scripted.scheduler.last_prompt()


def test_show_answers_what_clients_read(served):
    """Continue reads the context from `parameters` (`num_ctx`) by older clients' `name`;
    Copilot from `model_info`; OllamaKit needs `license`, `modelfile`, `template` and
    `parameters` as strings."""
    r = post(served, "/api/show", name=served.model)
    assert r.status_code == 200
    shown = r.json()
    for key in ("license", "modelfile", "template", "parameters"):
        assert isinstance(shown[key], str), key
    params = dict(
        CONTINUE_PARAMETER.match(line).groups() for line in shown["parameters"].split("\n")
    )
    assert int(params["num_ctx"]) == CONTEXT
    info = shown["model_info"]
    arch = info["general.architecture"]
    assert info[f"{arch}.context_length"] == CONTEXT
    config = served.engine.checkpoint.config
    assert info[f"{arch}.embedding_length"] == config.hidden_size
    assert info[f"{arch}.block_count"] == config.num_hidden_layers
    tensors = served.engine.checkpoint.tensors.values()
    assert info["general.parameter_count"] == sum(int(np.prod(t.shape)) for t in tensors)
    assert shown["details"]["parent_model"] == "" and shown["details"]["family"] == arch
    assert OLLAMAKIT_TIME.fullmatch(shown["modified_at"])
    assert "PARAMETER num_ctx" in shown["modelfile"]
    typed = client(served).show(served.model + ":latest")
    assert typed.modelinfo[f"{arch}.context_length"] == CONTEXT and typed.modified_at


def test_the_model_list_and_running_models_as_clients_decode_them(served):
    """A digest as Ollama gives one (sha256, hex; the same each time), times with their
    fractional seconds, the capabilities; `ollama ps` on the CPU: all of the memory held
    is the CPU's (`size_vram` 0)."""
    (listed,) = httpx.get(served.base + "/api/tags", headers=HEADERS).json()["models"]
    assert re.fullmatch(r"[0-9a-f]{64}", listed["digest"])
    assert OLLAMAKIT_TIME.fullmatch(listed["modified_at"])
    assert {"parent_model", "format", "family", "families", "parameter_size",
            "quantization_level"} <= set(listed["details"])  # fmt: skip
    assert "tools" in listed["capabilities"] and "completion" in listed["capabilities"]
    (again,) = client(served).list().models
    assert again.digest == listed["digest"]
    (running,) = httpx.get(served.base + "/api/ps", headers=HEADERS).json()["models"]
    assert running["digest"] == listed["digest"]
    assert OLLAMAKIT_TIME.fullmatch(running["expires_at"])
    weights, held = served.engine.checkpoint.total_bytes, served.engine.held_bytes()
    assert running["size_vram"] == 0 and running["size"] == weights + held
    assert running["context_length"] == CONTEXT
    line = post(served, "/api/generate", model=served.model)  # the load answer
    assert OLLAMAKIT_TIME.fullmatch(line.json()["created_at"])
    assert datetime.fromisoformat(line.json()["created_at"]).year >= 2025
