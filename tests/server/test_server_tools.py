"""Tools: rendered by the chat template exactly as transformers renders them, tool calls
parsed from Qwen3.5's output form (and the JSON form), and a round trip through the server."""

import json

import pytest

from engine.server.chat_request import read_chat
from engine.server.reply import ReplySplitter, StopFilter, parse_tool_call
from engine.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city — in °C",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["city"],
        },
    },
}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "now", "parameters": {}}}]
ARGS = {"city": "Paris", "days": 2, "metric": True, "hours": [9, 18]}
# The history as an OpenAI client sends it: arguments as a JSON string.
HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris, and the time?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(ARGS)},
            },
            {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    {"role": "user", "content": "Thanks!"},
]


def as_template_reads_it(messages):
    """The history with arguments as mappings (what transformers' users pass)."""
    out = json.loads(json.dumps(messages))
    for call in out[2]["tool_calls"]:
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


@pytest.mark.parametrize("thinking", [True, False])
def test_tools_and_history_render_as_transformers_renders_them(tools_checkpoint, thinking):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tools_checkpoint)
    expected = hf.apply_chat_template(
        as_template_reads_it(HISTORY),
        tools=TOOLS,
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=thinking,
    )
    ours = Tokenizer.load(tools_checkpoint)
    request = read_chat({"messages": HISTORY, "tools": TOOLS})
    rendered = ours.apply_chat_template(request.messages, True, thinking, request.tools)
    assert rendered == expected
    assert json.dumps(WEATHER, ensure_ascii=False) in rendered  # the tool, verbatim
    assert "<parameter=hours>\n[9, 18]\n</parameter>" in rendered
    assert "<tool_response>\n12:00\n</tool_response><|im_end|>" in rendered


def test_a_rendered_tool_call_parses_back_to_the_same_call(tools_checkpoint):
    """The template's own writing of a call, read by the parser, gives the call back."""
    ours = Tokenizer.load(tools_checkpoint)
    messages = as_template_reads_it(HISTORY)[:3]
    text = ours.apply_chat_template(messages, add_generation_prompt=False, tools=TOOLS)
    reply = text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    schemas = {"get_weather": WEATHER["function"]["parameters"]}
    splitter = ReplySplitter(thinking=False, tools=True, schemas=schemas)
    pieces = [p for ch in reply for p in splitter.feed(ch)] + splitter.finish()
    assert "".join(p.text for p in pieces if p.kind == "content") == "Let me look."
    calls = [p.call for p in pieces if p.kind == "tool_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", ARGS),
        ("now", {}),
    ]


def test_the_json_form_and_broken_blocks():
    call = parse_tool_call('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert (call.name, json.loads(call.arguments)) == ("f", {"x": 1})
    assert parse_tool_call("<tool_call>\nnot a call\n</tool_call>") is None
    splitter = ReplySplitter(thinking=False, tools=True)
    pieces = splitter.feed("Hi <tool_call>\nnonsense\n</tool_call> there") + splitter.finish()
    assert "".join(p.text for p in pieces) == "Hi<tool_call>\nnonsense\n</tool_call> there"
    # Without tools offered, the markers are plain text.
    splitter = ReplySplitter(thinking=False, tools=False)
    text = "a <tool_call>\n{}\n</tool_call>"
    assert "".join(p.text for p in splitter.feed(text) + splitter.finish()) == text


def test_markers_and_stops_split_anywhere_in_the_stream():
    text = "thought\n</think>\n\nanswer <tool_call>\n<function=f>\n</function>\n</tool_call>"
    for size in (1, 2, 3, 7):
        splitter = ReplySplitter(thinking=True, tools=True)
        parts = [text[i : i + size] for i in range(0, len(text), size)]
        pieces = [p for part in parts for p in splitter.feed(part)] + splitter.finish()
        joined = {
            k: "".join(p.text for p in pieces if p.kind == k) for k in ("reasoning", "content")
        }
        assert joined == {"reasoning": "thought", "content": "answer"}
        assert [p.call.name for p in pieces if p.kind == "tool_call"] == ["f"]
        stop = StopFilter(["STOP", "XY"])
        out = "".join(stop.feed(c) for c in "abcXzSTOdSTOP tail")
        assert out == "abcXzSTOd" and stop.hit


def test_tool_call_round_trip_through_the_server(scripted):
    """The model (made to) call a tool; the client runs it and sends the result back; the
    server renders the call and the result into the next prompt through the template."""
    client = scripted.client()
    call_text = (
        "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
    )
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    scripted.scheduler.say(call_text)
    reply = client.chat.completions.create(
        model=scripted.model, messages=messages, tools=TOOLS, extra_body=off
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    prompt = scripted.engine.tokenizer.decode(scripted.scheduler.prompts[-1])
    assert json.dumps(WEATHER, ensure_ascii=False) in prompt
    # Streaming: the call's id and name first, then its arguments as they are written.
    scripted.scheduler.say(call_text)
    chunks = list(
        client.chat.completions.create(
            model=scripted.model, messages=messages, tools=TOOLS, extra_body=off, stream=True
        )
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    assert [d.function.name for d in deltas] == ["get_weather"] + [None] * (len(deltas) - 1)
    assert deltas[0].id.startswith("call_") and deltas[0].function.arguments == ""
    assert {d.index for d in deltas} == {0} and len(deltas) > 3
    joined = "".join(d.function.arguments for d in deltas)
    assert json.loads(joined) == {"city": "Paris", "days": 2}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The client's own accumulation of the stream gives the whole call.
    scripted.scheduler.say(call_text)
    with client.chat.completions.stream(
        model=scripted.model, messages=messages, tools=TOOLS, extra_body=off
    ) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        streamed = stream.get_final_completion().choices[0].message
    assert [(e.name, e.parsed_arguments) for e in done] == [("get_weather", None)]
    assert streamed.content == "I will check."
    assert json.loads(streamed.tool_calls[0].function.arguments) == {"city": "Paris", "days": 2}
    # The result goes back; the next prompt holds the call and the result.
    messages += [choice.message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    scripted.scheduler.say("It is 21 degrees.")
    final = client.chat.completions.create(
        model=scripted.model, messages=messages, tools=TOOLS, extra_body=off
    )
    assert final.choices[0].message.content == "It is 21 degrees."
    assert final.choices[0].finish_reason == "stop"
    prompt = scripted.engine.tokenizer.decode(scripted.scheduler.prompts[-1])
    assert (
        "I will check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>"
    ) in prompt
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in prompt
    # tool_choice "none": the tools are still rendered, and nothing is parsed.
    scripted.scheduler.say(call_text)
    plain = client.chat.completions.create(
        model=scripted.model, messages=messages[:1], tools=TOOLS, tool_choice="none", extra_body=off
    )
    assert plain.choices[0].finish_reason == "stop" and not plain.choices[0].message.tool_calls
    assert plain.choices[0].message.content == call_text
    assert "<tools>" in scripted.engine.tokenizer.decode(scripted.scheduler.prompts[-1])


def test_arguments_of_pydantic_models_parse_back_as_their_types(tools_checkpoint, scripted):
    """Parameters as pydantic writes them (a model inside a model by `$ref`, Optional as
    `anyOf` with null, a union): the template's writing of a call reads back as the same
    values, not as their text, and the call validates as the model."""
    import openai
    from pydantic import BaseModel

    class Place(BaseModel):
        city: str
        zip: str | None = None

    class Trip(BaseModel):
        start: Place
        stops: list[Place]
        nights: int | None = None
        code: int | str

    def untitled(schema):  # pydantic's titles out: the prompt fits the tiny context
        if isinstance(schema, dict):
            return {k: untitled(v) for k, v in schema.items() if k != "title"}
        return [untitled(v) for v in schema] if isinstance(schema, list) else schema

    tool = untitled(openai.pydantic_function_tool(Trip, name="plan"))
    assert "$ref" in json.dumps(tool) and "anyOf" in json.dumps(tool)
    args = {
        "start": {"city": "Oz", "zip": "75"},
        "stops": [{"city": "Ur", "zip": None}],
        "nights": 3,
        "code": "0042",
    }
    ours = Tokenizer.load(tools_checkpoint)
    call = {"type": "function", "function": {"name": "plan", "arguments": args}}
    messages = [{"role": "user", "content": "Plan"}, {"role": "assistant", "content": "",
                "tool_calls": [call]}]  # fmt: skip
    text = ours.apply_chat_template(messages, add_generation_prompt=False, tools=[tool])
    start = text.index("<tool_call>\n<function=plan>")
    block = text[start : text.index("</tool_call>", start) + len("</tool_call>")]
    assert '<parameter=stops>\n[{"city": "Ur", "zip": null}]\n</parameter>' in block
    parsed = parse_tool_call(block, {"plan": tool["function"]["parameters"]})
    assert json.loads(parsed.arguments) == args
    # Through the server, as `client.chat.completions.parse` reads it.
    scripted.scheduler.say(block)
    reply = scripted.client().chat.completions.parse(
        model=scripted.model, messages=messages[:1], tools=[tool],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    (got,) = reply.choices[0].message.tool_calls
    assert got.function.parsed_arguments == args
    assert Trip.model_validate_json(got.function.arguments) == Trip(**args)


def test_an_empty_reasoning_is_passed_on_as_given():
    """`reasoning_content: ""` reaches the template as given (as transformers passes it):
    Qwen3.5's template then takes the content whole rather than looking in it for a
    thinking block."""
    said = {"role": "assistant", "content": "a </think> b", "reasoning_content": ""}
    chat = read_chat({"messages": [{"role": "user", "content": "Hi"}, said]})
    assert chat.messages[1]["reasoning_content"] == ""
    chat = read_chat(
        {"messages": [{"role": "user", "content": "Hi"}, {**said, "reasoning_content": None}]}
    )
    assert "reasoning_content" not in chat.messages[1]
