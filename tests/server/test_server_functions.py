"""Function calling as clients ask for it beyond plain `tools`: OpenAI's older form
(`functions`, `function_call`, `function` messages) through the official client, read as the
tools request it stands for with the call given back as `function_call`; and one call a
reply (`parallel_tool_calls: false`, Anthropic's `disable_parallel_tool_use`)."""

import json

import httpx
import pytest

from tests.server.conftest import KEY, PARIS_CALL, WEATHER_PARAMETERS

WEATHER_FN = {"name": "get_weather", "description": "The weather", "parameters": WEATHER_PARAMETERS}
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def test_a_function_call_round_trip(scripted):
    client = scripted.client()
    scripted.scheduler.say(PARIS_CALL)
    reply = client.chat.completions.create(
        model=scripted.model, messages=ASK, functions=[WEATHER_FN], extra_body=OFF
    )
    legacy_prompt = scripted.scheduler.prompts[-1]
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call"
    assert choice.message.content == "I will check." and not choice.message.tool_calls
    assert choice.message.function_call.name == "get_weather"
    assert json.loads(choice.message.function_call.arguments) == {"city": "Paris", "days": 2}
    # The prompt is the one the same request in the tools shape renders.
    scripted.scheduler.say(PARIS_CALL)
    tools = [{"type": "function", "function": WEATHER_FN}]
    client.chat.completions.create(model=scripted.model, messages=ASK, tools=tools, extra_body=OFF)
    assert scripted.scheduler.prompts[-1] == legacy_prompt
    # Streamed: the function's name first, then its arguments as they are written.
    scripted.scheduler.say(PARIS_CALL)
    chunks = list(
        client.chat.completions.create(
            model=scripted.model, messages=ASK, functions=[WEATHER_FN], extra_body=OFF, stream=True
        )
    )
    calls = [c.choices[0].delta.function_call for c in chunks if c.choices[0].delta.function_call]
    assert [c.name for c in calls] == ["get_weather"] + [None] * (len(calls) - 1)
    assert calls[0].arguments == "" and len(calls) > 2
    arguments = "".join(c.arguments for c in calls)
    assert json.loads(arguments) == {"city": "Paris", "days": 2}
    assert chunks[-1].choices[0].finish_reason == "function_call"
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    # The result goes back as a `function` message; the template renders it as a tool's.
    history = ASK + [choice.message.model_dump(exclude_none=True)]
    history += [{"role": "function", "name": "get_weather", "content": '{"temp": 21}'}]
    scripted.scheduler.say("It is 21 degrees.")
    final = client.chat.completions.create(
        model=scripted.model, messages=history, functions=[WEATHER_FN], extra_body=OFF
    )
    assert final.choices[0].message.content == "It is 21 degrees."
    assert final.choices[0].finish_reason == "stop"
    prompt = scripted.scheduler.last_prompt()
    assert "<function=get_weather>\n<parameter=city>\nParis\n</parameter>" in prompt
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response>' in prompt


def test_function_call_none_and_a_named_function(scripted):
    client = scripted.client()
    scripted.scheduler.say(PARIS_CALL)
    plain = client.chat.completions.create(
        model=scripted.model, messages=ASK, functions=[WEATHER_FN], function_call="none",
        extra_body=OFF,
    )  # fmt: skip
    assert plain.choices[0].finish_reason == "stop" and not plain.choices[0].message.function_call
    assert plain.choices[0].message.content == PARIS_CALL  # not read as a call
    assert "<tools>" in scripted.scheduler.last_prompt()  # offered, as with "auto"
    forced = client.chat.completions.create(
        model=scripted.model, messages=ASK, functions=[WEATHER_FN],
        function_call={"name": "get_weather"}, extra_body=OFF,
    )  # fmt: skip
    assert forced.choices[0].finish_reason == "function_call"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"functions": [WEATHER_FN], "tools": [{"type": "function", "function": WEATHER_FN}]},
         "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"functions": [{"description": "no name"}]}, "functions[0]"),
        ({"functions": [WEATHER_FN], "function_call": "always"}, "function_call"),
        ({"messages": ASK + [{"role": "function", "content": "21"}]}, "messages[1].name"),
    ],
)  # fmt: skip
def test_malformed_function_requests_are_refused_by_name(served, body, param):
    body = {"model": served.model, "messages": ASK, **body}
    reply = httpx.post(f"{served.url}/chat/completions", json=body,
                       headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


TWO_CALLS = PARIS_CALL + (
    "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    "</function>\n</tool_call>"
)


def test_parallel_tool_calls_false_ends_the_reply_at_its_first_call(scripted):
    """OpenAI's `parallel_tool_calls: false` (and the Responses API's), Anthropic's
    `disable_parallel_tool_use`: one call a reply, the rest not decoded."""
    client = scripted.client()
    tools = [{"type": "function", "function": WEATHER_FN}]
    cities = []
    for parallel in (True, False):
        scripted.scheduler.say(TWO_CALLS)
        reply = client.chat.completions.create(
            model=scripted.model, messages=ASK, tools=tools, parallel_tool_calls=parallel,
            extra_body=OFF,
        )  # fmt: skip
        assert reply.choices[0].finish_reason == "tool_calls"
        cities.append([json.loads(c.function.arguments)["city"]
                       for c in reply.choices[0].message.tool_calls])  # fmt: skip
    assert cities == [["Paris", "Rome"], ["Paris"]]
    assert reply.usage.completion_tokens < len(scripted.engine.tokenizer.encode(TWO_CALLS))
    scripted.scheduler.say(TWO_CALLS)
    chunks = list(
        client.chat.completions.create(
            model=scripted.model,
            messages=ASK,
            tools=tools,
            parallel_tool_calls=False,
            extra_body=OFF,
            stream=True,
        )  # fmt: skip
    )
    calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert {c.index for c in calls} == {0} and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert json.loads("".join(c.function.arguments for c in calls))["city"] == "Paris"
    scripted.scheduler.say(TWO_CALLS)
    response = client.responses.create(
        model=scripted.model, input="Weather in Paris?", parallel_tool_calls=False,
        tools=[{"type": "function", **WEATHER_FN}], reasoning={"effort": "none"},
    )  # fmt: skip
    assert [item.type for item in response.output].count("function_call") == 1
    import anthropic

    messages = anthropic.Anthropic(base_url=scripted.base, api_key=KEY, max_retries=0)
    scripted.scheduler.say(TWO_CALLS)
    answer = messages.messages.create(
        model=scripted.model, max_tokens=200, messages=ASK,
        tools=[{"name": "get_weather", "input_schema": WEATHER_PARAMETERS}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )  # fmt: skip
    assert [b.type for b in answer.content].count("tool_use") == 1
    assert answer.stop_reason == "tool_use"
