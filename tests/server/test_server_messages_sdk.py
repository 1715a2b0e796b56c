"""The Messages API as the `anthropic` SDK's own helpers drive it: the beta tool runner
(an agent loop that runs `@beta_tool` functions and sends their results back), which asks
the server to hold the conversation (`thread`) and sends the whole history again where the
server says it holds none; a tool call cut by max_tokens as the client assembles it."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import KEY

anthropic = pytest.importorskip("anthropic")

WEATHER_CALL = (
    "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n</function>\n</tool_call>"
)


def client(served):
    return anthropic.Anthropic(base_url=served.base, api_key=KEY, max_retries=0)


def scripts(served, monkeypatch, *replies: str) -> None:
    """Each request the scheduler takes says the next of `replies`."""
    left = list(replies)
    first = served.scheduler._first_token

    def say_next(request, logits):
        if left:
            served.scheduler.say(left.pop(0))
        return first(request, logits)

    monkeypatch.setattr(served.scheduler, "_first_token", say_next)


@pytest.mark.parametrize("stream", [False, True])
def test_the_tool_runner_sends_the_whole_conversation(scripted, monkeypatch, stream):
    """The runner's second turn carries the tools, the question and the call with its
    result: the model reads the whole conversation, not the tool's result alone."""

    @anthropic.beta_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"21C in {city}"

    scripts(scripted, monkeypatch, WEATHER_CALL, "It is 21C.")
    runner = client(scripted).beta.messages.tool_runner(
        model=scripted.model, max_tokens=200, tools=[get_weather], stream=stream,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )  # fmt: skip
    replies = [turn.get_final_message() if stream else turn for turn in runner]
    assert [b.type for b in replies[0].content] == ["text", "tool_use"]
    assert replies[0].content[1].input == {"city": "Paris"}
    assert replies[-1].content[0].text == "It is 21C." and replies[-1].stop_reason == "end_turn"
    prompt = scripted.scheduler.last_prompt()
    assert '"name": "get_weather"' in prompt and "Weather in Paris?" in prompt
    assert "<parameter=city>\nParis\n</parameter>" in prompt
    assert "<tool_response>\n21C in Paris\n</tool_response>" in prompt


def test_a_thread_is_refused_as_anthropics_api_refuses_one_it_cannot_hold(scripted):
    """`thread` (server-held conversation state) is refused with the error code the SDK
    reads to send the whole conversation instead; nothing is generated."""
    body = {"model": scripted.model, "max_tokens": 16, "thread": {"type": "create"},
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    r = httpx.post(scripted.url + "/messages", json=body, headers={"x-api-key": KEY})
    got = r.json()
    assert r.status_code == 400 and got["error"]["type"] == "invalid_request_error", got
    assert got["error"]["details"] == {"error_code": "thread_unsupported_request"}
    assert "'thread'" in got["error"]["message"] and "messages" in got["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        client(scripted).beta.messages.create(
            model=scripted.model, max_tokens=16, messages=body["messages"],
            thread={"type": "continue", "previous_message_id": "msg_0"},
        )  # fmt: skip
    assert json.dumps(info.value.body).count("thread_unsupported_request") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_inside_its_closing_tag_keeps_its_value(scripted, stream):
    """max_tokens cuts the reply inside `</parameter>`: the call's input holds the value
    the model wrote, not the start of the tag after it."""
    tokenizer = scripted.engine.tokenizer
    ids = tokenizer.encode(WEATHER_CALL)
    cut = next(
        n
        for n in range(len(ids))
        if (tail := tokenizer.decode(ids[:n]).rpartition("Paris")[2])
        and "<" in tail
        and "\n</parameter>".startswith(tail)
        and tail != "\n</parameter>"
    )
    weather = {"name": "get_weather", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
    scripted.scheduler.say(WEATHER_CALL)
    ask = {"model": scripted.model, "max_tokens": cut, "tools": [weather],
           "messages": [{"role": "user", "content": "Weather in Paris?"}]}  # fmt: skip
    if stream:
        with client(scripted).messages.stream(**ask) as s:
            reply = s.get_final_message()
    else:
        reply = client(scripted).messages.create(**ask)
    use = reply.content[-1]
    assert reply.stop_reason == "max_tokens" and use.type == "tool_use"
    assert use.input == {"city": "Paris"}
