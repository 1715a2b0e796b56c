"""Ollama's API (`/api/*`) through the `ollama` client: chat and generate read as the chat
request they stand for, the thinking in `thinking` when `think` is on, tool calls with
their arguments as objects and their results sent back, streamed as lines; the model list;
errors as `{"error": ...}`."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from tests.server.conftest import KEY, PARIS_CALL, WEATHER_PARAMETERS

ollama = pytest.importorskip("ollama")

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}
CALL = PARIS_CALL


def client(served):
    host = served.url[: -len("/v1")]
    return ollama.Client(host=host, headers={"Authorization": f"Bearer {KEY}"})


def test_chat_with_thinking_and_without(scripted):
    c = client(scripted)
    scripted.scheduler.say("Short and kind.</think>\n\nHello there!")
    reply = c.chat(model=scripted.model, messages=[{"role": "user", "content": "Hi"}], think=True)
    assert reply.message.content == "Hello there!" and reply.message.thinking == "Short and kind."
    assert reply.done and reply.done_reason == "stop" and reply.eval_count > 0
    assert reply.prompt_eval_count == len(scripted.scheduler.prompts[-1])
    # the prompt's time and the reply's apart, as `ollama run --verbose` reads them
    assert 0 < reply.prompt_eval_duration < reply.total_duration
    assert reply.prompt_eval_duration + reply.eval_duration == reply.total_duration
    scripted.scheduler.say("Hello there!")
    reply = c.chat(model=scripted.model, messages=[{"role": "user", "content": "Hi"}], think=False)
    assert reply.message.content == "Hello there!" and not reply.message.thinking
    assert scripted.scheduler.last_prompt().endswith("<think>\n\n</think>\n\n")


def test_a_stream_of_lines_adds_up_to_the_reply(scripted):
    scripted.scheduler.say("Short and kind.</think>\n\nHello there!")
    parts = list(
        client(scripted).chat(
            model=scripted.model, messages=[{"role": "user", "content": "Hi"}], think=True,
            stream=True,
        )
    )  # fmt: skip
    assert "".join(p.message.content for p in parts) == "Hello there!"
    assert "".join(p.message.thinking or "" for p in parts) == "Short and kind."
    assert parts[-1].done and not any(p.done for p in parts[:-1])


def test_a_tool_call_and_its_result_go_round(scripted):
    c = client(scripted)
    scripted.scheduler.say(CALL)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = c.chat(model=scripted.model, messages=messages, tools=[WEATHER], think=False)
    (call,) = reply.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {
        "city": "Paris", "days": 2}  # fmt: skip
    scripted.scheduler.say("It is 21 degrees.")
    messages += [
        reply.message.model_dump(exclude_none=True),
        {"role": "tool", "content": '{"temp": 21}', "tool_name": "get_weather"},
    ]
    final = c.chat(model=scripted.model, messages=messages, tools=[WEATHER], think=False)
    assert final.message.content == "It is 21 degrees."
    prompt = scripted.scheduler.last_prompt()
    assert "<parameter=city>\nParis\n</parameter>" in prompt
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in prompt


def test_generate_with_a_system_prompt_and_raw(scripted):
    c = client(scripted)
    scripted.scheduler.say("Hello there!")
    reply = c.generate(model=scripted.model, prompt="Hi", system="Be brief.", think=False)
    assert reply.response == "Hello there!" and reply.done
    assert "<|im_start|>system\nBe brief.<|im_end|>" in scripted.scheduler.last_prompt()
    scripted.scheduler.say(" upon a time")
    raw = c.generate(model=scripted.model, prompt="Once", raw=True, options={"num_predict": 8})
    assert raw.response == " upon a time"
    assert scripted.scheduler.last_prompt() == "Once"  # no template


def test_a_json_schema_holds_the_answer(served):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    reply = client(served).chat(
        model=served.model, messages=[{"role": "user", "content": "Well?"}], think=False,
        format=schema, options={"temperature": 0, "num_predict": 200},
    )  # fmt: skip
    assert set(json.loads(reply.message.content)) == {"ok"}


def test_the_model_list_and_errors(served):
    c = client(served)
    for method in ("GET", "HEAD"):  # how front-ends and scripts see that the server is up
        r = httpx.request(method, served.base + "/")
        assert r.status_code == 200 and r.text == ("Ollama is running" if method == "GET" else "")
    assert [m.model for m in c.list().models] == [served.model]
    (listed,) = c.list().models
    tensors = served.engine.checkpoint.tensors.values()
    params = sum(int(np.prod(t.shape)) for t in tensors)
    assert listed.size == served.engine.checkpoint.total_bytes > 0
    assert float(listed.details.parameter_size[:-1]) * 1e6 == pytest.approx(params, rel=1e-2)
    assert listed.details.quantization_level == "F32"  # the fp32 test checkpoint
    (running,) = c.ps().models  # `ollama ps`
    assert running.model == served.model and running.size_vram == 0  # numpy: on the CPU
    assert running.expires_at.year > 2100  # loaded until the server stops
    with pytest.raises(ollama.ResponseError) as err:
        c.chat(model="other", messages=[{"role": "user", "content": "Hi"}])
    assert err.value.status_code == 404 and "other" in err.value.error
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(served.base + "/api/chat", json={"model": served.model, "messages": "Hi"},
                   headers=headers)  # fmt: skip
    assert r.status_code == 400 and "non-empty" in r.json()["error"]
    # Nothing to answer: how Ollama's clients get a model loaded; it is, already.
    for path, body in (("/api/chat", {"messages": []}), ("/api/generate", {})):
        r = httpx.post(served.base + path, json={"model": served.model, **body}, headers=headers)
        assert r.json()["done"] is True and r.json()["done_reason"] == "load"


def test_a_chat_longer_than_the_context_loses_its_oldest_turns(scripted):
    """As Ollama does: the oldest turns go (the system prompt and the last message stay),
    only as many as must; `"truncate": false` refuses the chat instead; `num_predict` past
    the room left is cut to it."""
    from tests.server.conftest import CONTEXT

    c = client(scripted)
    messages = [{"role": "system", "content": "Be brief."}]
    for n in range(12):
        messages.append({"role": "user", "content": f"question {n}: " + "hello world " * 30})
        messages.append({"role": "assistant", "content": f"answer {n}: " + "fine thanks " * 30})
    messages.append({"role": "user", "content": "the last question"})
    scripted.scheduler.say("Sure.")
    reply = c.chat(model=scripted.model, messages=messages, think=False,
                   options={"num_predict": 4 * CONTEXT})  # fmt: skip
    assert reply.message.content == "Sure."
    prompt = scripted.scheduler.last_prompt()
    assert len(scripted.scheduler.prompts[-1]) < CONTEXT
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "the last question" in prompt and "question 0:" not in prompt
    kept = [n for n in range(12) if f"question {n}:" in prompt]
    assert kept == list(range(kept[0], 12))  # the newest turns, whole
    longer = messages[:1] + messages[1 + 2 * (kept[0] - 1) :]  # one turn more
    ids = scripted.engine.chat_ids(longer, enable_thinking=False)
    assert len(ids) + CONTEXT // 4 > CONTEXT  # it would not have fitted: no more went
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": scripted.model, "messages": messages, "stream": False, "truncate": False}
    r = httpx.post(scripted.base + "/api/chat", json=body, headers=headers)
    assert r.status_code == 400 and "context" in r.json()["error"]


def test_routes_not_served_here_are_named(served):
    c = client(served)
    with pytest.raises(ollama.ResponseError) as err:
        c.embed(model=served.model, input="hello")
    assert err.value.status_code == 404 and "no embedding model" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        c.pull("qwen3.5:4b")
    assert err.value.status_code == 404 and "Models tab" in err.value.error
    import openai

    with pytest.raises(openai.NotFoundError, match="no embedding model"):
        served.client().embeddings.create(model=served.model, input="hello")


def test_the_model_by_its_latest_tag_and_the_version_clients_check(scripted):
    """Ollama's clients name a model with its tag (`NAME:latest`, as `ollama run NAME`
    and front-ends do) and check the server's version against the least they need
    (VS Code's Copilot: 0.6.4)."""
    c = client(scripted)
    name = scripted.model + ":latest"
    scripted.scheduler.say("Hello.")
    reply = c.chat(model=name, messages=[{"role": "user", "content": "Hi"}], think=False)
    assert reply.message.content == "Hello." and reply.model == name
    assert c.show(name).capabilities == ["completion", "tools", "thinking"]
    scripted.scheduler.say("Hi.")
    assert c.generate(model=name, prompt="Hi", think=False).response == "Hi."
    with pytest.raises(ollama.ResponseError) as err:
        c.chat(model=scripted.model + ":4b", messages=[{"role": "user", "content": "Hi"}])
    assert err.value.status_code == 404
    version = httpx.get(scripted.base + "/api/version").json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)


def test_generate_goes_on_from_the_context_it_gave(scripted):
    """/api/generate answers with the conversation's ids as `context`; sent back with the
    next prompt, that prompt goes on from them (templated, or raw)."""
    c = client(scripted)
    scripted.scheduler.say("Hello there!")
    first = c.generate(model=scripted.model, prompt="Hi", think=False)
    said = scripted.scheduler.prompts[-1]
    reply_ids = scripted.engine.tokenizer.encode("Hello there!") + [min(scripted.engine.eos_ids)]
    assert list(first.context) == said + reply_ids
    scripted.scheduler.say("Fine.")
    second = c.generate(model=scripted.model, prompt="How are you?", think=False,
                        context=first.context)  # fmt: skip
    prompt = scripted.scheduler.prompts[-1]
    assert prompt[: len(first.context)] == list(first.context)
    assert scripted.engine.tokenizer.decode(prompt[len(first.context) :]).startswith(
        "<|im_start|>user\nHow are you?<|im_end|>"
    )
    assert list(second.context)[: len(prompt)] == prompt
    scripted.scheduler.say("!")
    raw = c.generate(model=scripted.model, prompt=" And then", raw=True, context=first.context)
    assert scripted.scheduler.prompts[-1] == [
        *first.context,
        *scripted.engine.tokenizer.encode(" And then"),
    ]
    assert raw.context is None  # as Ollama: a raw prompt gives none back
    bad = httpx.post(f"{scripted.base}/api/generate", headers={"Authorization": f"Bearer {KEY}"},
                     json={"model": scripted.model, "prompt": "x", "context": [1, -2]})  # fmt: skip
    assert bad.status_code == 400 and "'context'" in bad.json()["error"]
