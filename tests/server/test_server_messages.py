"""Anthropic's Messages API (`/v1/messages`) through the `anthropic` client: the system
prompt and messages read as the chat request they stand for, thinking only when enabled,
the answer as text blocks, tool calls as tool_use blocks and their results sent back as
tool_result blocks; streamed as the client's stream helper assembles it; errors in
Anthropic's shape, naming the Messages field."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import KEY, PARIS_CALL, WEATHER_PARAMETERS

anthropic = pytest.importorskip("anthropic")

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": WEATHER_PARAMETERS,
}
CALL = PARIS_CALL
THINK = {"type": "enabled", "budget_tokens": 1024}


def client(served, key: str = KEY):
    base = served.url[: -len("/v1")]
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)


def test_text_and_thinking_blocks(scripted):
    scripted.scheduler.say("Short and kind.</think>\n\nHello there!")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=64, system="Be brief.", thinking=THINK,
        messages=[{"role": "user", "content": "Hi"}],
    )  # fmt: skip
    thinking, text = reply.content
    assert thinking.type == "thinking" and thinking.thinking == "Short and kind."
    assert text.type == "text" and text.text == "Hello there!"
    assert reply.stop_reason == "end_turn" and reply.usage.output_tokens > 0
    assert "<|im_start|>system\nBe brief.<|im_end|>" in scripted.scheduler.last_prompt()


def test_no_thinking_unless_enabled(scripted):
    scripted.scheduler.say("Hello there!")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=64, messages=[{"role": "user", "content": "Hi"}]
    )
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == "Hello there!"
    closed = "<think>\n\n</think>\n\n"  # the template closes the block
    assert scripted.scheduler.last_prompt().endswith(closed)


def test_the_stream_assembles_into_the_same_message(scripted):
    scripted.scheduler.say("Short and kind.</think>\n\nHello there!")
    with client(scripted).messages.stream(
        model=scripted.model, max_tokens=64, thinking=THINK,
        messages=[{"role": "user", "content": "Hi"}],
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "content_block_delta" in kinds
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == "Hello there!" and final.stop_reason == "end_turn"


def test_a_tool_use_and_its_result_go_round(scripted):
    c = client(scripted)
    scripted.scheduler.say(CALL)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    reply = c.messages.create(
        model=scripted.model, max_tokens=200, tools=[WEATHER], messages=messages
    )
    text, use = reply.content
    assert text.text == "I will check." and reply.stop_reason == "tool_use"
    assert use.type == "tool_use" and use.name == "get_weather"
    assert use.input == {"city": "Paris", "days": 2}
    scripted.scheduler.say("It is 21 degrees.")
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": '{"temp": 21}'}]},
    ]  # fmt: skip
    final = c.messages.create(
        model=scripted.model, max_tokens=200, tools=[WEATHER], messages=messages
    )
    assert final.content[0].text == "It is 21 degrees." and final.stop_reason == "end_turn"
    prompt = scripted.scheduler.last_prompt()
    assert (
        "<|im_start|>assistant\nI will check.\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>"
    ) in prompt
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in prompt


def test_a_stop_sequence_is_named(scripted):
    scripted.scheduler.say("one two three")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=64, stop_sequences=["two"],
        messages=[{"role": "user", "content": "Count"}],
    )  # fmt: skip
    assert reply.content[0].text.strip() == "one" and reply.stop_reason == "stop_sequence"
    assert reply.stop_sequence == "two"


@pytest.mark.parametrize(
    ("extra", "status", "words"),
    [
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
         "messages[0].content[0]"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tools[0]"),
        ({"messages": []}, 400, "non-empty"),
        ({"stop_sequences": 5}, 400, "'stop_sequences' must be"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": "ls"}]}]}, 400,
         "'messages[1].content[0].input' must be of type object"),
        ({"messages": [{"role": "user", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}]}, 400,
         "'messages[0].content[0]' is a 'tool_use' block, which only an assistant message"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}]}]}, 400,
         "'messages[1].content[0]' is a 'tool_result' block, which only a user message"),
        ({"thinking": {"type": "enable"}}, 400,
         "'thinking.type' must be enabled, disabled, adaptive or between_tools"),
        ({"thinking": {"budget_tokens": 2048}}, 400, "'thinking.type' must be"),
        ({"tools": [{"name": "f", "input_schema": "x"}]}, 400,
         "'tools[0].input_schema' must be of type object"),
        ({"tools": [{"name": 5, "input_schema": {"type": "object"}}]}, 400,
         "'tools[0].name' must be a non-empty string"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "input": {}}]}]}, 400,
         "'messages[1].content[0].name' must be a non-empty string"),
        ({"tools": [{"name": "f", "input_schema": {"type": "object"}}],
          "tool_choice": {"type": "tool"}}, 400, "'tool_choice.name' must be a non-empty string"),
    ],
)  # fmt: skip
def test_errors_come_in_anthropics_shape(served, extra, status, words):
    body = {"model": served.model, "max_tokens": 16,
            "messages": [{"role": "user", "content": "Hi"}], **extra}  # fmt: skip
    r = httpx.post(served.url + "/messages", json=body, headers={"x-api-key": KEY})
    got = r.json()
    assert r.status_code == status and got["type"] == "error", got
    assert got["error"]["type"] == "invalid_request_error" and words in got["error"]["message"]


def test_count_tokens_names_a_model_not_served(served):
    """count_tokens checks `model` as a message does: another model's count would be wrong."""
    with pytest.raises(anthropic.NotFoundError) as info:
        client(served).messages.count_tokens(
            model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
        )
    assert info.value.body["error"]["type"] == "not_found_error"
    assert "'gpt-4o'" in info.value.body["error"]["message"]


def test_the_key_goes_as_x_api_key(served):
    with pytest.raises(anthropic.AuthenticationError):
        client(served, key="wrong").messages.create(
            model=served.model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]
        )


def test_count_tokens_counts_the_prompt_a_request_would_run(scripted):
    c = client(scripted)
    messages = [{"role": "user", "content": "Hi"}]
    count = c.messages.count_tokens(model=scripted.model, system="Be brief.", messages=messages)
    scripted.scheduler.say("Hello")
    c.messages.create(model=scripted.model, max_tokens=8, system="Be brief.", messages=messages)
    assert count.input_tokens == len(scripted.scheduler.prompts[-1]) > 0


def test_a_max_tokens_past_the_context_is_cut_to_the_room_left(scripted):
    """Anthropic's clients ask for the most their model may write (16,000 tokens here),
    whatever the context: the reply may run to the end of the context instead."""
    scripted.scheduler.say("Hello")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=16000, messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.content[0].text == "Hello" and reply.stop_reason == "end_turn"


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_that_fills_the_context_says_so(scripted, stream):
    """A reply cut where the context ends, short of the max_tokens asked for, stops with
    `model_context_window_exceeded` (as Anthropic's API says it), not `max_tokens`: the
    client did not reach its own limit, and should not raise it to go on."""
    messages = [{"role": "user", "content": "word " * 235}]
    scripted.scheduler.say("one two three four five six seven " * 20)
    c = client(scripted)
    ask = {"model": scripted.model, "max_tokens": 16000, "messages": messages}
    if stream:
        with c.messages.stream(**ask) as s:
            reply = s.get_final_message()
    else:
        reply = c.messages.create(**ask)
    prompt = len(scripted.scheduler.prompts[-1])
    assert reply.usage.output_tokens == 1024 - prompt > 0
    assert reply.stop_reason == "model_context_window_exceeded"
    scripted.scheduler.say("one two three four five six seven " * 20)
    short = c.messages.create(**{**ask, "max_tokens": 4})
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 4


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_0_reads_the_prompt_into_the_cache_and_writes_nothing(scripted, stream):
    """As Anthropic's API documents it, `max_tokens: 0` pre-warms the prompt cache: no
    content, no output tokens; the same conversation then starts from the cache."""
    messages = [{"role": "user", "content": f"A long question read ahead ({stream})"}]
    scripted.scheduler.say("Never shown")
    c = client(scripted)
    if stream:
        with c.messages.stream(model=scripted.model, max_tokens=0, messages=messages) as s:
            kinds = [event.type for event in s]
            warm = s.get_final_message()
        assert "content_block_start" not in kinds and kinds[-1] == "message_stop"
    else:
        warm = c.messages.create(model=scripted.model, max_tokens=0, messages=messages)
    prompt = len(scripted.scheduler.prompts[-1])
    assert warm.content == [] and warm.stop_reason == "max_tokens"
    assert (warm.usage.input_tokens, warm.usage.output_tokens) == (prompt, 0)
    scripted.scheduler.say("Hello")
    reply = c.messages.create(model=scripted.model, max_tokens=8, messages=messages)
    assert reply.content[0].text == "Hello" and reply.usage.cache_read_input_tokens == prompt
    with pytest.raises(anthropic.BadRequestError, match="'max_tokens' = -2"):
        c.messages.create(model=scripted.model, max_tokens=-2, messages=messages)


def test_the_streams_last_usage_holds_the_input_tokens_too(scripted):
    """Clients take message_delta's usage as the reply's final counts (LangChain's
    ChatAnthropic reads its input tokens there): it holds the prompt's tokens as well."""
    scripted.scheduler.say("Hello there!")
    body = {"model": scripted.model, "max_tokens": 64, "stream": True,
            "messages": [{"role": "user", "content": "Hi, count me"}]}  # fmt: skip
    with httpx.stream("POST", scripted.url + "/messages", json=body,
                      headers={"x-api-key": KEY}) as r:  # fmt: skip
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    (start,) = [e for e in events if e["type"] == "message_start"]
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    prompt = len(scripted.scheduler.prompts[-1])
    read = delta["usage"]["input_tokens"]  # the rest came from the prompt cache
    assert start["message"]["usage"]["input_tokens"] == prompt
    assert read + delta["usage"]["cache_read_input_tokens"] == prompt and read > 0
    assert delta["usage"]["output_tokens"] > 0
    with client(scripted).messages.stream(
        model=scripted.model, max_tokens=64, messages=body["messages"]
    ) as stream:
        final = stream.get_final_message()
    u = final.usage
    # The same prompt again: restored whole from its saved end, nothing read.
    assert (u.input_tokens, u.cache_read_input_tokens) == (0, prompt)


def test_adaptive_thinking_lets_the_model_think(scripted):
    """`thinking: {"type": "adaptive"}` leaves thinking to the model: Qwen3.5 thinks."""
    scripted.scheduler.say("Short.</think>\n\nHello!")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=64, thinking={"type": "adaptive"},
        messages=[{"role": "user", "content": "Hi"}],
    )  # fmt: skip
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in reply.content] == [
        ("thinking", "Short."),
        ("text", "Hello!"),
    ]
    assert scripted.scheduler.last_prompt().endswith("<|im_start|>assistant\n<think>\n")
