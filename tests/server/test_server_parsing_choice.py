"""`tool_choice: "none"`: the model is not to call a tool. As OpenAI's and Anthropic's APIs
serve it, the tools are still in the prompt (the conversation's calls and results refer to
them, and the prompt goes on from the turns before, which the prompt cache reuses), and
as vLLM serves it, nothing the model writes is parsed as a call: a call written anyway
comes back as the answer's text."""

from __future__ import annotations

import pytest

from tests.server.conftest import KEY, PARIS_CALL, WEATHER_PARAMETERS

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}
OFF = {"chat_template_kwargs": {"enable_thinking": False}}
ASKED = [{"role": "user", "content": "Weather in Paris?"}]


def test_the_tools_stay_in_the_prompt_and_no_call_is_parsed(scripted):
    client = scripted.client()
    scripted.scheduler.say("Sunny.")
    client.chat.completions.create(model=scripted.model, messages=ASKED, tools=[WEATHER],
                                   extra_body=OFF)  # fmt: skip
    offered = scripted.scheduler.last_prompt()
    scripted.scheduler.say(PARIS_CALL)
    reply = client.chat.completions.create(
        model=scripted.model, messages=ASKED, tools=[WEATHER], tool_choice="none", extra_body=OFF
    )
    assert scripted.scheduler.last_prompt() == offered  # the same prompt as with "auto"
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == PARIS_CALL
    # Streamed alike.
    scripted.scheduler.say(PARIS_CALL)
    chunks = list(
        client.chat.completions.create(
            model=scripted.model, messages=ASKED, tools=[WEATHER], tool_choice="none",
            extra_body=OFF, stream=True,
        )
    )  # fmt: skip
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any(d.tool_calls for d in deltas)
    assert "".join(d.content or "" for d in deltas) == PARIS_CALL
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_anthropics_none_keeps_the_tools_too(scripted):
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=scripted.base, api_key=KEY, max_retries=0)
    tool = {"name": "get_weather", "input_schema": WEATHER_PARAMETERS}
    scripted.scheduler.say(PARIS_CALL)
    reply = client.messages.create(
        model=scripted.model, max_tokens=200, messages=ASKED, tools=[tool],
        tool_choice={"type": "none"},
    )  # fmt: skip
    assert [b.type for b in reply.content] == ["text"] and reply.stop_reason == "end_turn"
    assert reply.content[0].text == PARIS_CALL
    assert "<tools>" in scripted.scheduler.last_prompt()
