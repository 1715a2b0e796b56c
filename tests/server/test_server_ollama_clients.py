"""Ollama's API as its front-ends use it beyond one question and its answer: a reply that
goes on from the assistant's words already written (Open WebUI's "Continue Response"),
the options' errors named as the client sent them, `num_predict` on a raw prompt, model
names in any case, and `/api/pull` of the model that is served."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import CONTEXT, KEY

ollama = pytest.importorskip("ollama")

HEADERS = {"Authorization": f"Bearer {KEY}"}


def client(served):
    return ollama.Client(host=served.base, headers=HEADERS)


def post(served, path: str, **body) -> httpx.Response:
    return httpx.post(served.base + path, json=body, headers=HEADERS, timeout=30)


def test_a_last_assistant_message_is_gone_on_from(scripted):
    """As Ollama renders Qwen3.5's chat: the last message, the assistant's, is left open and
    the reply goes on from its words (no new turn, no thinking first); the reply holds
    only what follows them, streamed or not."""
    c = client(scripted)
    messages = [
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": "Once upon"},
    ]
    scripted.scheduler.say(" a time.")
    reply = c.chat(model=scripted.model, messages=messages)
    assert reply.message.content == " a time." and not reply.message.thinking
    prompt = scripted.scheduler.last_prompt()
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nOnce upon")
    assert prompt.count("<|im_start|>assistant") == 1
    scripted.scheduler.say(" a time.")
    parts = list(c.chat(model=scripted.model, messages=messages, stream=True, think=True))
    assert "".join(p.message.content for p in parts) == " a time."
    assert scripted.scheduler.last_prompt() == prompt
    # An assistant turn with nothing written is no start of a reply: a new turn follows it.
    scripted.scheduler.say("Hello.")
    empty = [*messages[:1], {"role": "assistant", "content": ""}]
    assert c.chat(model=scripted.model, messages=empty, think=False).message.content == "Hello."
    assert scripted.scheduler.last_prompt().count("<|im_start|>assistant") == 2


def test_num_predict_past_the_room_is_cut_on_a_raw_prompt_too(scripted):
    """`num_predict` larger than the context leaves is cut to the room, whether the prompt
    is templated or raw (Continue's autocomplete sends raw prompts with its own limit)."""
    for raw in (False, True):
        scripted.scheduler.say("Hello there.")
        r = post(scripted, "/api/generate", model=scripted.model, prompt="Once", raw=raw,
                 think=False, stream=False, options={"num_predict": 4 * CONTEXT})  # fmt: skip
        assert r.status_code == 200, (raw, r.text)
        assert r.json()["response"] == "Hello there." and r.json()["done_reason"] == "stop"


@pytest.mark.parametrize("raw", [False, True])
def test_errors_name_the_fields_as_the_client_sent_them(served, raw):
    """A sampling option is refused as `options.NAME` and a schema as `format`: the
    request's own fields, not those of the chat request it is read as."""
    for options, name in (
        ({"temperature": "hot"}, "options.temperature"),
        ({"top_k": "5"}, "options.top_k"),
        ({"stop": [1, 2]}, "options.stop"),
        ({"seed": 2**70}, "options.seed"),
    ):
        r = post(served, "/api/generate", model=served.model, prompt="Hi", raw=raw,
                 options=options)  # fmt: skip
        assert r.status_code == 400 and f"'{name}'" in r.json()["error"], (options, r.text)
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "[a-z"}}}
    r = post(served, "/api/generate", model=served.model, prompt="Hi", raw=raw, format=schema)
    assert r.status_code == 400 and r.json()["error"].startswith("'format'"), r.text
    if not raw:
        r = post(served, "/api/chat", model=served.model, format=schema,
                 messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
        assert r.status_code == 400 and r.json()["error"].startswith("'format'"), r.text


def test_the_model_is_found_by_its_name_in_any_case(scripted):
    """Ollama matches model names without regard to case (`ollama run qwen3.5` finds
    `Qwen3.5`): so do the chat, generate and show routes; the reply names the model as
    asked."""
    c = client(scripted)
    for name in (scripted.model.upper(), scripted.model.lower() + ":LATEST"):
        scripted.scheduler.say("Hello.")
        reply = c.chat(model=name, messages=[{"role": "user", "content": "Hi"}], think=False)
        assert reply.message.content == "Hello." and reply.model == name
        scripted.scheduler.say("Hi.")
        assert c.generate(model=name, prompt="Hi", raw=True).response == "Hi."
        assert c.show(name).capabilities
    with pytest.raises(ollama.ResponseError) as err:
        c.chat(model=scripted.model.upper() + "-2", messages=[{"role": "user", "content": "Hi"}])
    assert err.value.status_code == 404


def test_pulling_the_served_model_succeeds_and_another_is_refused(served):
    """Scripts and front-ends pull a model before they use it (`ollama.pull(NAME)`): the
    one served is here already, so the pull succeeds at once, whole or streamed; another
    is refused by name, with where models come from."""
    c = client(served)
    assert c.pull(served.model).status == "success"
    assert c.pull(served.model.upper() + ":latest").status == "success"
    assert [p.status for p in c.pull(served.model, stream=True)] == ["success"]
    r = post(served, "/api/pull", name=served.model)  # older clients' `name`, streamed
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    with pytest.raises(ollama.ResponseError) as err:
        c.pull("qwen3.5:4b")
    assert err.value.status_code == 404 and "Models tab" in err.value.error
    r = post(served, "/api/pull")
    assert r.status_code == 400 and r.json() == {"error": "model is required"}
