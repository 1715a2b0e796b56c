"""`response_format`: JSON mode and JSON schemas hold the reply (engine.constraint), with the
tiny random model choosing freely inside what the grammar allows."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.server.conftest import KEY, Scripted, serve

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["happy", "sad"]}},
    "required": ["ok", "mood"],
    "additionalProperties": False,
}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


def fits(text: str) -> bool:
    value = json.loads(text)
    return (
        set(value) == {"ok", "mood"}
        and isinstance(value["ok"], bool)
        and (value["mood"] in ("happy", "sad"))
    )


def ask(client, model, fmt, **kw):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "How are you?"}],
        max_tokens=kw.pop("max_tokens", 300),
        response_format=fmt,
        extra_body=NO_THINKING,
        **kw,
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_schema_holds_the_reply_greedy_and_sampled(served, temperature):
    reply = ask(served.client(), served.model, AS_SCHEMA, temperature=temperature, seed=3)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and fits(choice.message.content), choice


def test_json_mode_streams_one_json_object(served):
    stream = ask(served.client(), served.model, {"type": "json_object"}, stream=True, temperature=0)
    chunks = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert isinstance(json.loads("".join(chunks)), dict) and len(chunks) > 1


def test_the_free_reply_beside_a_held_one_is_what_it_is_alone(served):
    client = served.client()
    free = {"messages": [{"role": "user", "content": "Tell me"}], "max_tokens": 24}
    free |= {"temperature": 0, "extra_body": NO_THINKING, "model": served.model}
    alone = client.chat.completions.create(**free).choices[0].message.content
    got = {}
    held = threading.Thread(
        target=lambda: got.setdefault("held", ask(client, served.model, AS_SCHEMA, temperature=0))
    )
    held.start()
    beside = client.chat.completions.create(**free).choices[0].message.content
    held.join()
    assert beside == alone and fits(got["held"].choices[0].message.content)


class ThinksFirst(Scripted):
    """The script's tokens first (a thinking block), then the model's own picks."""

    def _pick(self, request) -> int | None:
        n = len(request.generated)
        return self.script[n] if n < len(self.script) else None

    def _first_token(self, request, logits) -> int:
        token = self._pick(request)
        return super(Scripted, self)._first_token(request, logits) if token is None else token

    def _next_tokens(self, batch) -> list[int]:
        picks = super(Scripted, self)._next_tokens(batch)
        scripted = [self._pick(r) for r in batch]
        return [p if t is None else t for t, p in zip(scripted, picks, strict=True)]


def test_thinking_runs_free_and_the_answer_after_it_is_held(tools_checkpoint):
    s = serve(tools_checkpoint, ThinksFirst)
    try:
        s.scheduler.say("Let me see: <tool_call> is not JSON.\n</think>\n\n")
        body = {"model": s.model, "messages": [{"role": "user", "content": "Hi"}]}
        body |= {"max_tokens": 300, "temperature": 0, "response_format": AS_SCHEMA}
        reply = s.client().chat.completions.create(**body)
        message = reply.choices[0].message
        assert "is not JSON" in message.reasoning_content and fits(message.content), message
    finally:
        s.server.stop()
        s.scheduler.close()


@pytest.mark.parametrize(
    "fmt, param",
    [
        ({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}},
         "response_format.json_schema.schema"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema", "json_schema": {"schema": []}},
         "response_format.json_schema.schema"),
    ],
)  # fmt: skip
def test_a_format_that_cannot_hold_a_reply_is_refused_by_name(served, fmt, param):
    body = {"messages": [{"role": "user", "content": "Hi"}], "response_format": fmt}
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{served.url}/chat/completions", json=body, headers=headers, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param, error
    assert "response_format" in error["message"]
    served.wait_idle()
    assert sorted(served.engine._free_slots) == [0, 1]


def test_completions_take_a_schema_too(served):
    r = served.client().completions.create(
        model=served.model,
        prompt="The answer:",
        max_tokens=300,
        temperature=0,
        extra_body={"response_format": AS_SCHEMA},
    )
    assert r.choices[0].finish_reason == "stop" and fits(r.choices[0].text)


CLOSED = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_units",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["c", "f"]}, "loud": {"type": "boolean"}},
                "required": ["unit", "loud"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": CLOSED}},
]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "set_units"}}]
)
def test_a_forced_tool_choice_gets_a_call_of_that_tool(served, choice):
    reply = served.client().chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "Use a tool"}],
        tools=TOOLS,
        tool_choice=choice,
        temperature=0,
        max_tokens=300,
        extra_body=NO_THINKING,
    )
    choice_ = reply.choices[0]
    (call,) = choice_.message.tool_calls
    assert choice_.finish_reason == "tool_calls" and not choice_.message.content
    if isinstance(choice, dict):
        args = json.loads(call.function.arguments)
        assert call.function.name == "set_units" and args["unit"] in ("c", "f")
        assert isinstance(args["loud"], bool)
    else:
        assert call.function.name in ("set_units", "ping")


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "always"}, "tool_choice"),
    ],
)
def test_a_forced_tool_choice_that_cannot_be_met_is_refused_by_name(served, extra, param):
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, **extra}
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{served.url}/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()


def test_a_forced_call_of_a_tool_with_nested_models(served):
    """A tool whose parameters are pydantic models inside a model (`$defs` and `$ref`, as
    `openai.pydantic_function_tool` writes them): the forced call is held to them and
    parses back into the model; a model that contains itself is refused by name."""
    import openai
    from pydantic import BaseModel, Field

    class Place(BaseModel):
        city: str = Field(max_length=6)
        zip: str | None = Field(max_length=5)

    class Trip(BaseModel):
        start: Place
        stops: list[Place] = Field(max_length=1)

    tool = openai.pydantic_function_tool(Trip)
    assert "$defs" in tool["function"]["parameters"]
    reply = served.client().chat.completions.parse(
        model=served.model, messages=[{"role": "user", "content": "Plan a trip"}],
        tools=[tool], tool_choice={"type": "function", "function": {"name": "Trip"}},
        temperature=0, max_tokens=230, extra_body=NO_THINKING,
    )  # fmt: skip
    (call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert isinstance(call.function.parsed_arguments, Trip)

    class Tree(BaseModel):
        kids: list[Tree]

    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [openai.pydantic_function_tool(Tree)],
        "tool_choice": "required",
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(f"{served.url}/chat/completions", json=body, headers=headers, timeout=30)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "tool_choice", error
    assert "'Tree'" in error["message"] and "tool_choice 'auto'" in error["message"]
