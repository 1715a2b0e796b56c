"""Request and reply shapes the official `openai` client sends and reads, beyond the common
ones: what its typed parameters allow must be taken, and what its methods call must answer
in the shape the client parses."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import PARIS_CALL, WEATHER_PARAMETERS

OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def test_an_assistant_refusal_sent_back_is_read_as_its_words(scripted):
    """The client's assistant message takes `refusal` parts beside text parts, and a reply's
    message carries `refusal` beside a null content (what an earlier reply refused, sent
    back as history): either is read as the assistant's words."""
    for refused in (
        {"content": [{"type": "refusal", "refusal": "I cannot say."}]},
        {"content": None, "refusal": "I cannot say."},
    ):
        history = [
            {"role": "user", "content": "Tell me a secret."},
            {"role": "assistant", **refused},
            {"role": "user", "content": "Fine."},
        ]
        scripted.scheduler.say("Ok.")
        reply = scripted.client().chat.completions.create(
            model=scripted.model, messages=history, extra_body=OFF
        )
        assert reply.choices[0].message.content == "Ok."
        assert "assistant\nI cannot say.<|im_end|>" in scripted.scheduler.last_prompt()


def test_items_of_kept_responses_are_taken_by_reference(scripted):
    """A client that sends the conversation whole may name the items of a kept response by
    id (`item_reference`, as Vercel's AI SDK and Codex send earlier outputs): each reads as
    the item it names; an id not kept is refused, naming the input item and the id."""
    client = scripted.client()
    scripted.scheduler.say("Kind words.</think>\n\nHello, Ann.")
    first = client.responses.create(model=scripted.model, input="Hi, I am Ann.")
    reasoning, message = first.output
    scripted.scheduler.say("Still Ann.</think>\n\nYou are Ann.")
    history = [
        {"role": "user", "content": "Hi, I am Ann."},
        {"type": "item_reference", "id": reasoning.id},
        {"type": "item_reference", "id": message.id},
        {"role": "user", "content": "Who am I?"},
    ]
    second = client.responses.create(model=scripted.model, input=history)
    assert second.output_text == "You are Ann."
    prompt = scripted.scheduler.last_prompt()
    assert "user\nHi, I am Ann.<|im_end|>\n<|im_start|>assistant\nHello, Ann.<|im_end|>" in prompt
    assert prompt.endswith("user\nWho am I?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    gone = [history[0], {"type": "item_reference", "id": "msg_gone"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=scripted.model, input=gone)
    error = refused.value.body
    assert error["param"] == "input[1]" and "msg_gone" in error["message"]


def test_a_kept_response_lists_its_input_items(scripted):
    """`responses.input_items.list`: the items a kept response was asked with, each with an
    id and in the shape the client parses, newest first unless `order="asc"`, in pages
    (`limit`, `after`) the client follows."""
    client = scripted.client()
    scripted.scheduler.say("Kind words.</think>\n\nHello.")
    asked = [
        {"role": "user", "content": "Hi, I am Ann."},
        {"role": "assistant", "content": "Hello, Ann."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Sunny."},
    ]
    kept = client.responses.create(model=scripted.model, input=asked)
    listed = client.responses.input_items.list(kept.id, order="asc")
    assert [item.type for item in listed.data] == [
        "message", "message", "message", "function_call", "function_call_output"
    ]  # fmt: skip
    assert all(item.id for item in listed.data) and not listed.has_more
    first, answer, weather, call, output = listed.data
    assert first.role == "user" and first.content[0].text == "Hi, I am Ann."
    assert answer.role == "assistant" and answer.content[0].text == "Hello, Ann."
    assert weather.content[0].type == "input_text" and weather.content[0].text == "Weather?"
    assert call.name == "get_weather" and call.call_id == "c1" and output.output == "Sunny."
    newest = client.responses.input_items.list(kept.id, limit=2)
    assert [i.id for i in newest.data] == [output.id, call.id] and newest.has_more
    every = [item.id for item in client.responses.input_items.list(kept.id, limit=2)]
    assert every == [i.id for i in reversed(listed.data)]  # each page, after the last
    scripted.scheduler.say("Still Ann.")  # the ids name the items: taken by reference
    again = [{"type": "item_reference", "id": first.id}, {"role": "user", "content": "Who?"}]
    client.responses.create(model=scripted.model, input=again)
    assert "user\nHi, I am Ann.<|im_end|>" in scripted.scheduler.last_prompt()
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_gone")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_items.list(kept.id, limit=0)
    assert refused.value.body["param"] == "limit"


def test_a_kept_response_streams_again_as_its_events(scripted):
    """`responses.retrieve(id, stream=True)` answers with the kept response's events, as the
    client's stream reads them (`starting_after`: those after that sequence number)."""
    client = scripted.client()
    scripted.scheduler.say("Kind words.</think>\n\nHello" + PARIS_CALL[len("I will check.") :])
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS}
    kept = client.responses.create(model=scripted.model, input="Hi", tools=[tool])
    events = list(client.responses.retrieve(kept.id, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output == kept.output
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert text == "Hello" and json.loads(args) == {"city": "Paris", "days": 2}
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message", "function_call"]
    later = list(client.responses.retrieve(kept.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in later] == list(range(4, len(events)))


UNITS = {
    "type": "object",
    "properties": {"unit": {"enum": ["c", "f"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
TWO_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "set_units", "parameters": UNITS}},
]


def allowed(mode: str, *names: str, responses: bool = False) -> dict:
    """`tool_choice` of type allowed_tools, in chat's form or the Responses API's."""
    if responses:
        tools = [{"type": "function", "name": n} for n in names]
        return {"type": "allowed_tools", "mode": mode, "tools": tools}
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": tools}}


def test_allowed_tools_offer_only_those_tools(scripted):
    """`tool_choice` {"type": "allowed_tools"} (mode auto): the model is offered the tools it
    names, of those the request lists, and no other; in either API's form."""
    client = scripted.client()
    scripted.scheduler.say("Fine.")
    client.chat.completions.create(
        model=scripted.model,
        messages=[{"role": "user", "content": "Hi"}],
        tools=TWO_TOOLS,
        tool_choice=allowed("auto", "set_units"),
    )
    prompt = scripted.scheduler.last_prompt()
    assert '"name": "set_units"' in prompt and "get_weather" not in prompt
    scripted.scheduler.say("Fine.")
    tools = [{"type": "function", **t["function"]} for t in TWO_TOOLS]
    choice = allowed("auto", "get_weather", responses=True)
    client.responses.create(model=scripted.model, input="Hi", tools=tools, tool_choice=choice)
    prompt = scripted.scheduler.last_prompt()
    assert '"name": "get_weather"' in prompt and "set_units" not in prompt
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=scripted.model,
            messages=[{"role": "user", "content": "Hi"}],
            tools=TWO_TOOLS,
            tool_choice=allowed("auto", "nope"),
        )
    assert refused.value.body["param"] == "tool_choice" and "nope" in refused.value.message


def test_allowed_tools_required_holds_the_reply_to_a_call_of_one_of_them(served):
    reply = served.client().chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "Use a tool"}],
        tools=TWO_TOOLS,
        tool_choice=allowed("required", "set_units"),
        temperature=0,
        max_tokens=300,
        extra_body=OFF,
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "set_units"
    assert json.loads(call.function.arguments)["unit"] in ("c", "f")


JSON_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'


def cut_inside(served, text: str, inside: str) -> int:
    """The fewest tokens of `text` whose text takes in `inside` (to cut a reply there)."""
    tokenizer = served.engine.tokenizer
    ids = tokenizer.encode(text)
    return next(k for k in range(1, len(ids)) if inside in tokenizer.decode(ids[:k]))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_json_form_call_cut_by_the_token_limit_is_a_call_closed(scripted, stream):
    """A call in the JSON form (a forced `tool_choice` holds the model to it) that the token
    limit cuts comes back as that call, its arguments closed as a JSON object and the
    finish reason `length`, as a call in Qwen3.5's own form does; not as its raw text."""
    scripted.scheduler.say(JSON_CALL + "\n</tool_call>")
    reply = scripted.client().chat.completions.create(
        model=scripted.model,
        messages=[{"role": "user", "content": "Weather?"}],
        tools=[TWO_TOOLS[0]],
        max_tokens=cut_inside(scripted, JSON_CALL, '"city": "Pa'),
        stream=stream,
        extra_body=OFF,
    )
    if stream:  # the chunks put together, as clients do
        chunks = [c.choices[0] for c in reply if c.choices]
        content = "".join(c.delta.content or "" for c in chunks)
        parts = [t for c in chunks for t in c.delta.tool_calls or ()]
        assert {t.index for t in parts} == {0}
        name = "".join(t.function.name or "" for t in parts)
        arguments = "".join(t.function.arguments or "" for t in parts)
        finish = chunks[-1].finish_reason
    else:
        choice = reply.choices[0]
        content, finish = choice.message.content, choice.finish_reason
        (call,) = choice.message.tool_calls
        name, arguments = call.function.name, call.function.arguments
    assert finish == "length" and not content
    assert name == "get_weather" and "Paris".startswith(json.loads(arguments)["city"])
