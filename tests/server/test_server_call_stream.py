"""A tool call sent as it is written: its name first, then its arguments' JSON text piece by
piece (a string parameter as its characters come), in the OpenAI, Responses and Anthropic
streams, read by the official clients' own stream accumulators; the pieces joined are the
whole call, for any call the template writes and any way the text is cut."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server.reply import ReplySplitter, parse_tool_call
from engine.tokenizer import Tokenizer
from tests.server.conftest import KEY, PARIS_CALL, WEATHER_PARAMETERS

OFF = {"chat_template_kwargs": {"enable_thinking": False}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_FN = {"name": "get_weather", "description": "The weather", "parameters": WEATHER_PARAMETERS}
WRITE = {
    "name": "write",
    "parameters": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "text": {"type": "string"},
            "lines": {"type": "integer"},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    },
}
SCHEMAS = {"write": WRITE["parameters"]}
# Text a string parameter may hold: quotes, backslashes, line breaks, markup, other scripts.
# (A value holding `</parameter>` itself cannot be read back from Qwen3.5's form.)
TEXT = (
    st.lists(
        st.sampled_from(list('ab <>/="\\\n\t{}é漢🙂') + ["</param", "</tool_c", "<parameter="]),
        max_size=24,
    )
    .map("".join)
    .filter(lambda s: "</parameter>" not in s and "</tool_call>" not in s)
)
ARGS = st.fixed_dictionaries(
    {},
    optional={
        "path": TEXT,
        "text": TEXT,
        "lines": st.integers(-5, 10**6),
        "ok": st.booleans(),
        "tags": st.lists(TEXT, max_size=3),
        "note": st.one_of(st.none(), TEXT),
    },
)


def rendered_call(tokenizer: Tokenizer, args: dict) -> str:
    """The call as the chat template writes it into an assistant turn."""
    call = {"type": "function", "function": {"name": "write", "arguments": args}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tools=[WRITE])
    reply = text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    return reply[reply.index("<tool_call>") :]


@pytest.fixture(scope="module")
def template(tools_checkpoint):
    return Tokenizer.load(tools_checkpoint)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=ARGS, cuts=st.lists(st.integers(1, 9), min_size=1, max_size=40))
def test_the_pieces_join_into_the_whole_call_however_the_text_is_cut(template, args, cuts):
    block = rendered_call(template, args)
    parts, at = [], 0
    for size in cuts * (len(block) // max(sum(cuts), 1) + 1):
        parts.append(block[at : at + size])
        at += size
    parts.append(block[at:])
    splitter = ReplySplitter(thinking=False, tools=True, schemas=SCHEMAS)
    pieces = [p for part in parts for p in splitter.feed(part)] + splitter.finish()
    kinds = [p.kind for p in pieces]
    assert kinds[0] == "call_start" and kinds[-1] == "tool_call"
    assert set(kinds[1:-1]) <= {"call_args"}
    call = pieces[-1].call
    assert {p.call.id for p in pieces} == {call.id} and call.name == "write"
    assert "".join(p.text for p in pieces if p.kind == "call_args") == call.arguments
    assert json.loads(call.arguments) == args
    assert parse_tool_call(block, SCHEMAS).arguments == call.arguments  # read whole, the same


def test_a_string_streams_before_its_parameter_closes():
    splitter = ReplySplitter(thinking=False, tools=True, schemas=SCHEMAS)
    head = '<tool_call>\n<function=write>\n<parameter=text>\nline one\n"two"\n'
    pieces = splitter.feed(head)
    assert [p.kind for p in pieces] == ["call_start", "call_args"]
    # The last line break is held: it is the form's if `</parameter>` follows.
    assert pieces[1].text == '{"text": "line one\\n\\"two\\"'
    more = splitter.feed("three\n</param")
    assert [p.text for p in more] == ["\\nthree"]
    rest = splitter.feed("eter>\n<parameter=lines>\n12") + splitter.feed("\n</parameter>\n")
    assert "".join(p.text for p in rest) == '", "lines": 12'
    end = splitter.feed("</function>\n</tool_call>\nAfter.") + splitter.finish()
    assert [p.kind for p in end] == ["call_args", "tool_call", "content"]
    assert json.loads(end[1].call.arguments) == {"text": 'line one\n"two"\nthree', "lines": 12}
    assert end[2].text == "After."


def test_a_call_cut_short_is_closed_where_the_reply_ends():
    """The token limit (or a stop string) inside a call: the arguments given so far, closed
    into a JSON object, are the call (the finish reason says it was cut)."""
    for text, expected in [
        ("<tool_call>\n<function=write>\n<parameter=text>\nhalf a sen", {"text": "half a sen"}),
        ("<tool_call>\n<function=write>\n<parameter=lines>\n4", {"lines": 4}),
        ("<tool_call>\n<function=write>\n<parameter=te", {}),
        ("<tool_call>\n<function=write>", {}),
    ]:
        splitter = ReplySplitter(thinking=False, tools=True, schemas=SCHEMAS)
        pieces = splitter.feed(text) + splitter.finish()
        call = pieces[-1].call
        assert json.loads(call.arguments) == expected
        assert "".join(p.text for p in pieces if p.kind == "call_args") == call.arguments


def test_a_repeated_parameter_keeps_its_first_value():
    block = (
        "<tool_call>\n<function=write>\n<parameter=text>\nfirst\n</parameter>\n"
        "<parameter=text>\nsecond\n</parameter>\n</function>\n</tool_call>"
    )
    assert json.loads(parse_tool_call(block, SCHEMAS).arguments) == {"text": "first"}


def test_the_json_form_comes_whole():
    splitter = ReplySplitter(thinking=False, tools=True)
    text = 'Sure.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    pieces = [p for ch in text for p in splitter.feed(ch)] + splitter.finish()
    assert {p.kind for p in pieces[:-1]} == {"content"} and pieces[-1].kind == "tool_call"
    assert "".join(p.text for p in pieces[:-1]) == "Sure."
    assert json.loads(pieces[-1].call.arguments) == {"x": 1}


TWO_CALLS = PARIS_CALL + (
    "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome, "
    '"the eternal city"\n</parameter>\n</function>\n</tool_call>'
)


def test_openai_stream_sends_each_call_as_it_is_written(scripted):
    client = scripted.client()
    tools = [{"type": "function", "function": WEATHER_FN}]
    scripted.scheduler.say(TWO_CALLS)
    chunks = list(
        client.chat.completions.create(
            model=scripted.model, messages=ASK, tools=tools, extra_body=OFF, stream=True
        )
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    starts = [d for d in deltas if d.id]
    assert [(d.index, d.function.name, d.function.arguments) for d in starts] == [
        (0, "get_weather", ""),
        (1, "get_weather", ""),
    ]
    joined = ["".join(d.function.arguments for d in deltas if d.index == i) for i in (0, 1)]
    assert [json.loads(a) for a in joined] == [
        {"city": "Paris", "days": 2},
        {"city": 'Rome, "the eternal city"'},
    ]
    assert len(deltas) > 6  # in pieces, not one delta a call
    # The official client's accumulation: the same calls, ids from the first deltas.
    scripted.scheduler.say(TWO_CALLS)
    with client.chat.completions.stream(
        model=scripted.model, messages=ASK, tools=tools, extra_body=OFF
    ) as stream:
        message = stream.get_final_completion().choices[0].message
    assert message.content == "I will check."
    assert [json.loads(c.function.arguments)["city"] for c in message.tool_calls] == [
        "Paris",
        'Rome, "the eternal city"',
    ]
    assert all(c.id.startswith("call_") for c in message.tool_calls)


def test_a_call_cut_by_the_token_limit_streams_valid_json(scripted):
    client = scripted.client()
    tools = [{"type": "function", "function": WEATHER_FN}]
    scripted.scheduler.say(PARIS_CALL)
    cut = len(scripted.engine.tokenizer.encode(PARIS_CALL.split("</parameter>")[0])) - 1
    chunks = list(
        client.chat.completions.create(
            model=scripted.model,
            messages=ASK,
            tools=tools,
            extra_body=OFF,
            stream=True,
            max_tokens=cut,
        )  # fmt: skip
    )
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices[0].delta.tool_calls]
    arguments = json.loads("".join(d.function.arguments for d in deltas))
    assert list(arguments) == ["city"] and "Paris".startswith(arguments["city"])
    assert chunks[-1].choices[0].finish_reason == "length"


def test_responses_stream_sends_argument_deltas(scripted):
    client = scripted.client()
    scripted.scheduler.say(TWO_CALLS)
    tools = [{"type": "function", **WEATHER_FN}]
    with client.responses.stream(
        model=scripted.model, input="Weather?", tools=tools, reasoning={"effort": "none"}
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", 'Rome, "the eternal city"']
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 4 and [e.arguments for e in done] == [c.arguments for c in calls]
    for call in calls:
        pieces = [e.delta for e in deltas if e.item_id == call.id]
        assert len(pieces) > 1 and "".join(pieces) == call.arguments
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [(i.type, i.arguments) for i in added if i.type == "function_call"] == [
        ("function_call", ""),
        ("function_call", ""),
    ]


def test_anthropic_stream_sends_input_json_deltas(scripted):
    import anthropic

    client = anthropic.Anthropic(base_url=scripted.base, api_key=KEY, max_retries=0)
    tools = [{"name": "get_weather", "input_schema": WEATHER_PARAMETERS}]
    scripted.scheduler.say(TWO_CALLS)
    with client.messages.stream(
        model=scripted.model, max_tokens=800, tools=tools,
        messages=[{"role": "user", "content": "Weather?"}],
        thinking={"type": "disabled"},
    ) as stream:  # fmt: skip
        events = list(stream)
        message = stream.get_final_message()
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [u.input for u in uses] == [
        {"city": "Paris", "days": 2},
        {"city": 'Rome, "the eternal city"'},
    ]
    assert message.stop_reason == "tool_use"
    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.content_block.type for e in starts] == ["text", "tool_use", "tool_use"]
    assert all(e.content_block.input == {} for e in starts[1:])
    for index in (1, 2):
        partial = [
            e.delta.partial_json
            for e in events
            if e.type == "content_block_delta" and e.index == index
        ]
        assert len(partial) > 1 and json.loads("".join(partial)) == uses[index - 1].input
