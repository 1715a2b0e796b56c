"""The Responses API (`/v1/responses`) through the `openai` client: instructions and input
read as the chat request they stand for, the thinking as a reasoning item, the answer as
output_text, tool calls as function_call items and their outputs sent back; streamed as the
client's stream helper assembles it; and refusals that name the Responses field."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import KEY, PARIS_CALL, WEATHER_PARAMETERS

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": WEATHER_PARAMETERS,
}
CALL = PARIS_CALL


def test_thinking_and_answer_come_as_a_reasoning_item_and_output_text(scripted):
    scripted.scheduler.say("Short and kind.</think>\n\nHello there!")
    reply = scripted.client().responses.create(
        model=scripted.model, instructions="Be brief.", input="Hi", max_output_tokens=64
    )
    assert reply.status == "completed" and reply.output_text == "Hello there!"
    reasoning, message = reply.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Short and kind."
    assert message.type == "message" and message.role == "assistant"
    assert reply.usage.output_tokens > 0 and reply.usage.input_tokens > 0
    prompt = scripted.scheduler.last_prompt()
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt
    assert "<|im_start|>user\nHi<|im_end|>" in prompt


def test_the_stream_assembles_into_the_same_response(scripted):
    client = scripted.client()
    scripted.scheduler.say("Short and kind.</think>\n\nHello there!")
    with client.responses.stream(model=scripted.model, input="Hi", max_output_tokens=64) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert "response.reasoning_text.delta" in kinds
    assert final.output_text == "Hello there!"
    assert [item.type for item in final.output] == ["reasoning", "message"]


def test_a_function_call_and_its_output_go_round(scripted):
    client = scripted.client()
    off = {"effort": "none"}  # no thinking block
    scripted.scheduler.say(CALL)
    reply = client.responses.create(
        model=scripted.model, input="Weather in Paris?", tools=[WEATHER], reasoning=off
    )
    message, call = reply.output
    assert message.content[0].text == "I will check."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris", "days": 2}
    assert json.dumps(WEATHER["parameters"])[:20] in scripted.scheduler.last_prompt()
    scripted.scheduler.say("It is 21 degrees.")
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        *[item.model_dump(exclude_none=True) for item in reply.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'},
    ]
    final = client.responses.create(
        model=scripted.model, input=history, tools=[WEATHER], reasoning=off
    )
    assert final.output_text == "It is 21 degrees."
    prompt = scripted.scheduler.last_prompt()
    assert (  # one assistant turn, as the chat form renders it
        "<|im_start|>assistant\nI will check.\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>"
    ) in prompt
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in prompt


def test_a_json_schema_holds_the_answer(served):
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    reply = served.client().responses.create(
        model=served.model,
        input="Are you well?",
        max_output_tokens=200,
        temperature=0,
        reasoning={"effort": "none"},
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
    )
    assert set(json.loads(reply.output_text)) == {"ok"}


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "whole conversation"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0].content", "text and file"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
        ({"max_output_tokens": 10**7}, "max_output_tokens", "max_output_tokens"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type", "not supported"),
        ({"input": []}, "input", "non-empty"),
    ],
)  # fmt: skip
def test_refusals_name_the_responses_field(served, extra, param, words):
    body = {"model": served.model, "input": "Hi", **extra}
    r = httpx.post(served.url + "/responses", json=body, headers={"Authorization": f"Bearer {KEY}"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and words in error["message"]


def test_a_streamed_function_call_arrives_whole(scripted):
    scripted.scheduler.say(CALL)
    with scripted.client().responses.stream(
        model=scripted.model, input="Weather?", tools=[WEATHER], reasoning={"effort": "none"}
    ) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    call = final.output[-1]
    assert call.type == "function_call" and json.loads(call.arguments)["city"] == "Paris"
