"""Several replies in one request, through the official `openai` client: chat's `n`, and a
completion's batch of prompts with `n` each. Reply i of a seeded request is the reply a
request of one gets with the seed moved on by i; a stream interleaves the choices and
gives each its own end; a request refused partway (the queue full) or left by its client
leaves nothing running."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.server.conftest import KEY

USER = [{"role": "user", "content": "Tell me about the sea"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def ask(served, **kwargs):
    kwargs = {"model": served.model, "messages": USER, "max_tokens": 10, **kwargs}
    return served.client().chat.completions.create(**kwargs, extra_body=OFF)


def test_n_replies_are_the_seeded_replies_in_order(served):
    many = ask(served, n=3, temperature=1.0, seed=11, logprobs=True)
    assert [c.index for c in many.choices] == [0, 1, 2]
    singles = [ask(served, temperature=1.0, seed=11 + i, logprobs=True) for i in range(3)]
    texts = [c.message.content for c in many.choices]
    assert texts == [s.choices[0].message.content for s in singles]
    assert len(set(texts)) > 1, texts  # drawn apart
    for choice, single in zip(many.choices, singles, strict=True):
        assert choice.finish_reason == single.choices[0].finish_reason
        mine, alone = choice.logprobs.content, single.choices[0].logprobs.content
        assert [e.token for e in mine] == [e.token for e in alone]
        assert [e.logprob for e in mine] == pytest.approx([e.logprob for e in alone], abs=1e-4)
    assert many.usage.prompt_tokens == singles[0].usage.prompt_tokens  # the prompt once
    assert many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert not hasattr(many, "timings") or many.model_extra.get("timings") is None
    assert ask(served, n=2, temperature=1.0, seed=11).choices[1].message.content == texts[1]


def test_a_stream_of_n_replies_gives_each_its_chunks_and_end(served):
    whole = ask(served, n=2, temperature=1.0, seed=4)
    stream = ask(served, n=2, temperature=1.0, seed=4, stream=True,
                 stream_options={"include_usage": True})  # fmt: skip
    texts, ends, roles, usage = {0: "", 1: ""}, {}, [], None
    for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        (choice,) = chunk.choices
        assert choice.index not in ends, "a chunk after its choice's end"
        texts[choice.index] += choice.delta.content or ""
        roles += [choice.index] if choice.delta.role else []
        if choice.finish_reason:
            ends[choice.index] = choice.finish_reason
    assert sorted(roles) == [0, 1]
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert ends == {c.index: c.finish_reason for c in whole.choices}
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_a_batch_of_prompts_with_n_each(served):
    client = served.client()
    prompts = ["Once upon a time", "The sky over the harbour"]
    kwargs = {"model": served.model, "max_tokens": 8, "temperature": 1.0}
    batch = client.completions.create(prompt=prompts, n=2, seed=3, **kwargs)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(prompts):
        for j in range(2):
            one = client.completions.create(prompt=prompt, seed=3 + j, **kwargs)
            assert batch.choices[2 * p + j].text == one.choices[0].text, (p, j)
    ids = [len(served.engine.tokenizer.encode(p)) for p in prompts]
    assert batch.usage.prompt_tokens == sum(ids)
    streamed = client.completions.create(prompt=prompts, n=2, seed=3, stream=True, **kwargs)
    texts = ["", "", "", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in batch.choices]


def test_a_request_refused_partway_leaves_nothing_running(served, solo):
    """Two streams and six waiting take eight replies: with one reply running, the eighth
    of n = 8 is refused (503, queue full), and the seven before it are cancelled; the
    running reply goes on as it would alone."""
    served.wait_idle()
    expected = solo(USER, 60, thinking=False).lstrip("\n").rstrip()
    got: list[str] = []

    def running() -> None:
        reply = ask(served, max_tokens=60, temperature=0, stream=True)
        got.append("".join(c.choices[0].delta.content or "" for c in reply))

    thread = threading.Thread(target=running)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.scheduler.running:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(openai.APIStatusError) as refused:
        ask(served, n=8, max_tokens=900, temperature=1.0)
    assert refused.value.status_code == 503 and "queue" in str(refused.value)
    deadline = time.monotonic() + 2  # the seven would take far longer to write
    while served.scheduler.running + served.scheduler.waiting > 1:
        assert time.monotonic() < deadline, "replies of the refused request still run"
        time.sleep(0.01)
    thread.join(60)
    assert got and got[0].strip() == expected
    served.wait_idle()


def test_a_client_that_leaves_a_stream_of_n_replies_cancels_them_all(served):
    served.wait_idle()
    body = {"model": served.model, "messages": USER, "max_tokens": 900, "n": 3,
            "temperature": 1.0, "stream": True, **OFF}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=served.url, headers=headers, timeout=30) as http:
        with http.stream("POST", "/chat/completions", json=body) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("data: {"):
                pass
    served.wait_idle(timeout=2)  # the three would take far longer to write


def test_each_of_n_replies_has_its_own_tool_call(scripted):
    """Tools with `n` = 2: each reply's call is read on its own (its own id), whole and as
    the `openai` client gathers a stream of both choices."""
    from tests.server.conftest import PARIS_CALL, WEATHER_PARAMETERS

    tools = [{"type": "function", "function": {"name": "get_weather",
                                               "parameters": WEATHER_PARAMETERS}}]  # fmt: skip
    client = scripted.client()
    kwargs = {"model": scripted.model, "messages": USER, "tools": tools, "n": 2}
    kwargs["extra_body"] = OFF
    scripted.scheduler.say(PARIS_CALL)
    whole = client.chat.completions.create(**kwargs)
    calls = [c.message.tool_calls for c in whole.choices]
    assert [c.finish_reason for c in whole.choices] == ["tool_calls", "tool_calls"]
    assert [[t.function.name for t in each] for each in calls] == [["get_weather"]] * 2
    assert calls[0][0].id != calls[1][0].id
    assert all(json.loads(each[0].function.arguments) == {"city": "Paris", "days": 2}
               for each in calls)  # fmt: skip
    with client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    assert [c.index for c in final.choices] == [0, 1]
    for choice in final.choices:
        assert choice.message.content == "I will check."
        (call,) = choice.message.tool_calls
        assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
