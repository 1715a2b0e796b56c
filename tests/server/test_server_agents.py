"""Agent and structured-output libraries driven against the server as their docs show for an
OpenAI-compatible local server (a base URL and a key): `instructor`, `pydantic-ai` and the
OpenAI Agents SDK, over chat completions and the Responses API. The tiny model is made to
say what a real Qwen3.5 says (a thinking block, then a tool call in its XML form, a forced
call in the JSON form its grammar holds, or a JSON answer), so each library's own parsing
of the replies is what is tested."""

from __future__ import annotations

import asyncio
import json
import logging
from enum import StrEnum

import httpx
import pytest
from pydantic import BaseModel

from engine.server.app import create_app
from engine.server.runner import ServerThread
from engine.session import Engine
from tests.server.conftest import KEY, NUMPY, Scripted, Served

THINK = "The user asks; I know what to do.\n</think>\n\n"  # Qwen3.5 thinks first (on by default)
LEFT = "left its grammar"  # engine.constraint's warning when a reply leaves its grammar


class Says(Scripted):
    """Scripted, with one reply per request: each takes the next of `says` (the last one
    repeats), so an agent's turns (a call, then the answer after its result) can be said."""

    def __init__(self, engine: Engine, **kwargs) -> None:
        super().__init__(engine, **kwargs)
        self.replies: list[str] = []

    def says(self, *texts: str) -> None:
        self.replies = list(texts)

    def _first_token(self, request, logits) -> int:
        if self.replies:
            self.say(self.replies.pop(0) if len(self.replies) > 1 else self.replies[0])
        return super()._first_token(request, logits)


@pytest.fixture(scope="module")
def agentic(light_checkpoint):
    """The tiny model with a 4096-token context: instructor's JSON modes put the schema in
    the system prompt, agents their tools."""
    engine = Engine.load(light_checkpoint, NUMPY, context=4096, streams=1, max_rows=64)
    scheduler = Says(engine, queue_size=2).start()
    server = ServerThread(create_app(scheduler, api_key=KEY)).start()
    yield Served(engine, scheduler, server, light_checkpoint.name)
    server.stop()
    scheduler.close()


def xml_call(name: str, args: dict) -> str:
    """A call in Qwen3.5's own form (what it writes when no grammar holds it)."""
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def json_call(name: str, args: dict) -> str:
    """A call in the JSON form, which a forced `tool_choice` holds the model to."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    city: str
    zip: str | None = None


class Person(BaseModel):
    name: str
    age: int
    color: Color
    homes: list[Address]
    tags: set[str]  # `uniqueItems`, which the grammar cannot hold: left to pydantic
    nickname: str | None = None


ANN = {
    "name": "Ann",
    "age": 31,
    "color": "blue",
    "homes": [{"city": "Oz", "zip": None}],
    "tags": ["a", "b"],
    "nickname": None,
}
BOB = {**ANN, "name": "Bob", "tags": []}


class City(BaseModel):
    name: str
    country: str | None = None
    tags: list[str]


PARIS = {"name": "Paris", "country": "France", "tags": ["old"]}


def weather(city: str, days: int = 1) -> str:
    """The weather in a city."""
    return f"sunny in {city} for {days} days"


# ----- instructor -------------------------------------------------------------------------------
INSTRUCTOR = {  # mode -> what the model says
    "TOOLS": json_call("Person", ANN),  # a forced call of the model's tool
    "JSON": json.dumps(ANN),
    "JSON_SCHEMA": json.dumps(ANN),
    "MD_JSON": f"```json\n{json.dumps(ANN)}\n```",
}


@pytest.mark.parametrize("mode", [*INSTRUCTOR, "PARALLEL_TOOLS"])
def test_instructor_modes_give_the_model(agentic, mode, caplog):
    """Each of instructor's OpenAI modes (retries off) reads the reply into the model:
    nested models, Optional, an enum, lists and a set (whose `uniqueItems` a schema that is
    not strict leaves to the client, as OpenAI does, rather than refusing the request)."""
    instructor = pytest.importorskip("instructor")
    from collections.abc import Iterable

    client = instructor.from_openai(agentic.client(), mode=getattr(instructor.Mode, mode))
    ask = {"model": agentic.model, "messages": [{"role": "user", "content": "Ann?"}]}
    if mode == "PARALLEL_TOOLS":  # tool_choice auto: Qwen3.5's own form, two calls
        agentic.scheduler.says(THINK + xml_call("Person", ANN) + "\n" + xml_call("Person", BOB))
        got = list(client.chat.completions.create(**ask, response_model=Iterable[Person],
                                                  max_retries=0))  # fmt: skip
        assert [p.model_dump() for p in got] == [Person(**v).model_dump() for v in (ANN, BOB)]
        return
    agentic.scheduler.says(THINK + INSTRUCTOR[mode])
    with caplog.at_level(logging.WARNING, logger="engine.constraint"):
        got = client.chat.completions.create(**ask, response_model=Person, max_retries=0)
    assert got.model_dump() == Person(**ANN).model_dump() and got.color is Color.BLUE
    assert LEFT not in caplog.text  # the grammar held the reply (TOOLS, JSON, JSON_SCHEMA)


def test_instructor_streams_partial_and_iterable_models(agentic):
    """`create_partial` in JSON_SCHEMA mode: a model growing with the streamed text;
    `create_iterable` streamed in TOOLS mode: the forced call's list, item by item."""
    instructor = pytest.importorskip("instructor")

    raw = agentic.client()
    ask = {"model": agentic.model, "messages": [{"role": "user", "content": "Paris?"}]}
    client = instructor.from_openai(raw, mode=instructor.Mode.JSON_SCHEMA)
    agentic.scheduler.says(THINK + json.dumps(PARIS))
    parts = list(client.chat.completions.create_partial(**ask, response_model=City,
                                                        max_retries=0))  # fmt: skip
    assert len(parts) > 3 and parts[-1].model_dump() == PARIS
    assert parts[0].model_dump() != PARIS  # the first came before the whole reply
    client = instructor.from_openai(raw, mode=instructor.Mode.TOOLS)
    agentic.scheduler.says(THINK + json_call("IterableCity", {"tasks": [PARIS, PARIS]}))
    got = list(client.chat.completions.create_iterable(**ask, response_model=City,
                                                       max_retries=0, stream=True))  # fmt: skip
    assert [c.model_dump() for c in got] == [PARIS, PARIS]


def test_instructor_responses_tools_mode(agentic, caplog):
    """RESPONSES_TOOLS sends the model's schema as `text.format` and forces the call of its
    tool: the forced call holds the reply (the format is for a text reply), as in OpenAI's
    API, rather than the request being refused for having both."""
    instructor = pytest.importorskip("instructor")

    client = instructor.from_openai(agentic.client(), mode=instructor.Mode.RESPONSES_TOOLS)
    agentic.scheduler.says(THINK + json_call("City", PARIS))
    with caplog.at_level(logging.WARNING, logger="engine.constraint"):
        got = client.responses.create(model=agentic.model, input="Paris?", response_model=City,
                                      max_retries=0)  # fmt: skip
    assert got.model_dump() == PARIS and LEFT not in caplog.text


# ----- pydantic-ai ------------------------------------------------------------------------------
def pydantic_ai_model(served: Served, responses: bool):
    """An OpenAI-compatible model of pydantic-ai at the server (made in the event loop that
    runs it: the client's connections belong to that loop)."""
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url=served.url, api_key=KEY, max_retries=0)
    kind = OpenAIResponsesModel if responses else OpenAIChatModel
    return kind(served.model, provider=OpenAIProvider(openai_client=client))


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_pydantic_ai_agent_text_tools_and_streaming(agentic, responses):
    """Plain text; a tool the agent calls, its result sent back in the next request; the
    same streamed with `run_stream`."""
    pydantic_ai = pytest.importorskip("pydantic_ai")
    call = THINK + xml_call("weather", {"city": "Paris", "days": 2})

    async def flow():
        model = pydantic_ai_model(agentic, responses)
        agentic.scheduler.says(THINK + "Hello there.")
        text = (await pydantic_ai.Agent(model).run("Hi")).output
        agent = pydantic_ai.Agent(model, instructions="Be terse.", tools=[weather])
        agentic.scheduler.says(call, THINK + "Sunny, two days.")
        result = await agent.run("Weather in Paris?")
        prompt = agentic.scheduler.last_prompt()
        agentic.scheduler.says(call, THINK + "Sunny, two days.")
        async with agent.run_stream("Weather in Paris?") as run:
            deltas = [t async for t in run.stream_text(delta=True)]
        return text, result, prompt, deltas, run.usage

    text, result, prompt, deltas, usage = asyncio.run(flow())
    assert text == "Hello there."
    assert result.output == "Sunny, two days." and result.usage.tool_calls == 1
    assert "<tool_response>\nsunny in Paris for 2 days\n</tool_response>" in prompt
    assert "".join(deltas) == "Sunny, two days." and usage.tool_calls == 1
    assert usage.input_tokens > 0 and usage.output_tokens > 0


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
@pytest.mark.parametrize("native", [False, True], ids=["tool-output", "native-output"])
def test_pydantic_ai_structured_output_with_a_set(agentic, responses, native, caplog):
    """A pydantic model with a set as `output_type`: as a forced call of the output tool,
    and as a JSON schema (`NativeOutput`); both sent `strict: false`, so the set's
    `uniqueItems` is left to pydantic rather than refused."""
    pydantic_ai = pytest.importorskip("pydantic_ai")
    output = pydantic_ai.NativeOutput(Person) if native else Person
    said = json.dumps(ANN) if native else json_call("final_result", ANN)
    agentic.scheduler.says(THINK + said)

    async def flow():
        agent = pydantic_ai.Agent(pydantic_ai_model(agentic, responses), output_type=output)
        return (await agent.run("Ann?")).output

    with caplog.at_level(logging.WARNING, logger="engine.constraint"):
        assert asyncio.run(flow()) == Person(**ANN)
    assert LEFT not in caplog.text


def test_pydantic_ai_goes_on_from_the_previous_response(agentic):
    """`openai_previous_response_id="auto"`: after a tool call the agent sends only the
    tool's result with the id of the response it goes on from; the server puts the
    conversation back together from the responses it keeps."""
    pydantic_ai = pytest.importorskip("pydantic_ai")
    settings = {"openai_previous_response_id": "auto"}
    call = THINK + xml_call("weather", {"city": "Paris", "days": 2})
    agentic.scheduler.says(call, THINK + "Sunny.")

    async def flow():
        model = pydantic_ai_model(agentic, responses=True)
        agent = pydantic_ai.Agent(model, tools=[weather], model_settings=settings)
        return (await agent.run("Weather in Paris?")).output

    assert asyncio.run(flow()) == "Sunny."
    prompt = agentic.scheduler.last_prompt()
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>" in prompt
    assert "<function=weather>" in prompt and "sunny in Paris for 2 days" in prompt


def test_pydantic_ai_responses_logprobs(agentic):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    settings = {"openai_logprobs": True, "openai_top_logprobs": 2}
    agentic.scheduler.says(THINK + "Hello there.")

    async def flow():
        model = pydantic_ai_model(agentic, responses=True)
        return await pydantic_ai.Agent(model, model_settings=settings).run("Hi")

    logprobs = asyncio.run(flow()).all_messages()[-1].parts[-1].provider_details["logprobs"]
    assert "".join(e["token"] for e in logprobs) == "Hello there."
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in logprobs)


# ----- the OpenAI Agents SDK --------------------------------------------------------------------
def agents_model(served: Served, responses: bool):
    """An Agents SDK model at the server (made in the event loop that runs it)."""
    import agents
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=served.url, api_key=KEY, max_retries=0)
    kind = agents.OpenAIResponsesModel if responses else agents.OpenAIChatCompletionsModel
    return kind(model=served.model, openai_client=client)


@pytest.fixture
def agents():
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    return agents


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_agents_sdk_function_tool_run_and_stream(agentic, agents, responses):
    call = THINK + xml_call("weather", {"city": "Paris", "days": 2})

    async def flow():
        agent = agents.Agent(name="weather", instructions="Be terse.",
                             model=agents_model(agentic, responses),
                             tools=[agents.function_tool(weather)])  # fmt: skip
        agentic.scheduler.says(call, THINK + "Sunny, two days.")
        result = await agents.Runner.run(agent, "Weather in Paris?")
        prompt = agentic.scheduler.last_prompt()
        agentic.scheduler.says(call, THINK + "Sunny, two days.")
        run = agents.Runner.run_streamed(agent, "Weather in Paris?")
        kinds = [getattr(e, "name", e.type) async for e in run.stream_events()]
        return result.final_output, prompt, run.final_output, kinds

    final, prompt, streamed, kinds = asyncio.run(flow())
    assert final == streamed == "Sunny, two days."
    assert "sunny in Paris for 2 days" in prompt
    assert "tool_called" in kinds and "tool_output" in kinds


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_agents_sdk_required_tool_then_structured_output(agentic, agents, responses, caplog):
    """`output_type` with `tool_choice="required"`: the SDK sends the answer's format and a
    forced call in one request; the forced call holds that reply, and after the tool's
    result (tool_choice reset) the format holds the answer."""
    agentic.scheduler.says(THINK + json_call("weather", {"city": "Paris", "days": 1}),
                           THINK + json.dumps(PARIS))  # fmt: skip

    async def flow():
        required = agents.ModelSettings(tool_choice="required")
        agent = agents.Agent(name="cities", model=agents_model(agentic, responses),
                             output_type=City, tools=[agents.function_tool(weather)],
                             model_settings=required)  # fmt: skip
        return (await agents.Runner.run(agent, "Tell me of Paris")).final_output

    with caplog.at_level(logging.WARNING, logger="engine.constraint"):
        assert asyncio.run(flow()) == City(**PARIS)
    assert LEFT not in caplog.text
    assert "sunny in Paris for 1 days" in agentic.scheduler.last_prompt()


def test_agents_sdk_responses_logprobs_and_previous_response_id(agentic, agents):
    """`ModelSettings(top_logprobs=...)` asks the Responses API for each output text's
    token log-probabilities (streamed with each delta too); `auto_previous_response_id`
    sends each turn after the first as its new items and the id it goes on from."""
    call = THINK + xml_call("weather", {"city": "Paris", "days": 2})

    async def flow():
        agent = agents.Agent(name="weather", model=agents_model(agentic, True),
                             tools=[agents.function_tool(weather)],
                             model_settings=agents.ModelSettings(top_logprobs=2))  # fmt: skip
        agentic.scheduler.says(call, THINK + "Sunny.")
        result = await agents.Runner.run(agent, "Weather in Paris?",
                                         auto_previous_response_id=True)  # fmt: skip
        prompt = agentic.scheduler.last_prompt()
        agentic.scheduler.says(call, THINK + "Sunny.")
        run = agents.Runner.run_streamed(agent, "Weather in Paris?")
        deltas = [e.data async for e in run.stream_events() if e.type == "raw_response_event"
                  and e.data.type == "response.output_text.delta"]  # fmt: skip
        return result, prompt, deltas

    result, prompt, deltas = asyncio.run(flow())
    assert result.final_output == "Sunny." and len(result.raw_responses) == 2
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>" in prompt
    assert "<function=weather>" in prompt and "sunny in Paris for 2 days" in prompt
    text = result.raw_responses[-1].output[-1].content[0]
    assert "".join(e.token for e in text.logprobs) == "Sunny."
    assert all(len(e.top_logprobs) == 2 for e in text.logprobs)
    assert "".join(t.token for d in deltas for t in d.logprobs) == "Sunny."


# ----- what the libraries above rely on, by hand ------------------------------------------------
def test_kept_responses_are_retrieved_deleted_and_gone_on_from(agentic):
    client = agentic.client()
    agentic.scheduler.says(THINK + "Hello.")
    first = client.responses.create(model=agentic.model, input="Hi, I am Ann.")
    assert first.store and client.responses.retrieve(first.id).output_text == "Hello."
    agentic.scheduler.says(THINK + "You are Ann.")
    second = client.responses.create(model=agentic.model, input="Who am I?",
                                     previous_response_id=first.id)  # fmt: skip
    assert second.previous_response_id == first.id and second.output_text == "You are Ann."
    prompt = agentic.scheduler.last_prompt()
    assert "user\nHi, I am Ann.<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>" in prompt
    assert prompt.endswith("user\nWho am I?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    agentic.scheduler.says(THINK + "Ann, still.")  # a streamed response is kept too
    with client.responses.stream(model=agentic.model, input="And now?",
                                 previous_response_id=second.id) as stream:  # fmt: skip
        third = stream.get_final_response()
    assert client.responses.retrieve(third.id).output_text == "Ann, still."
    agentic.scheduler.says(THINK + "Yes.")
    client.responses.create(model=agentic.model, input="Sure?", previous_response_id=third.id)
    prompt = agentic.scheduler.last_prompt()
    assert prompt.index("Hi, I am Ann.") < prompt.index("Who am I?") < prompt.index("And now?")
    assert "assistant\nAnn, still.<|im_end|>" in prompt
    client.responses.delete(first.id)
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{agentic.url}/responses/{first.id}", headers=headers).status_code == 404
    # Gone (deleted), or never kept (store false): going on from it is refused by name.
    unkept = client.responses.create(model=agentic.model, input="Hi", store=False)
    for gone in (first.id, unkept.id):
        body = {"model": agentic.model, "input": "Again", "previous_response_id": gone}
        r = httpx.post(f"{agentic.url}/responses", json=body, headers=headers)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "previous_response_id", error
        assert gone in error["message"] and "whole conversation" in error["message"]


def test_a_strict_schema_the_grammar_cannot_hold_is_refused_by_name(agentic):
    """`strict: true` promises the whole schema: one with a keyword the grammar cannot hold
    (a set's `uniqueItems`) is refused, naming the field, rather than held in part."""
    schema = Person.model_json_schema()
    headers = {"Authorization": f"Bearer {KEY}"}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}
    body = {"messages": [{"role": "user", "content": "Hi"}], "response_format": fmt}
    r = httpx.post(f"{agentic.url}/chat/completions", json=body, headers=headers)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "response_format.json_schema.schema"
    assert "uniqueItems" in error["message"]
    tool = {"type": "function", "function": {"name": "p", "parameters": schema, "strict": True}}
    body = {"messages": [{"role": "user", "content": "Hi"}], "tools": [tool]}
    r = httpx.post(f"{agentic.url}/chat/completions", json={**body, "tool_choice": "required"},
                   headers=headers)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert "uniqueItems" in r.json()["error"]["message"]


def test_the_store_keeps_the_most_recent_responses_and_says_which_is_gone():
    from engine.server.protocol import ApiError
    from engine.server.response_store import ResponseStore

    def response(rid: str, text: str) -> dict:
        return {"id": rid, "output": [{"type": "message", "role": "assistant", "content": text}]}

    store = ResponseStore(most=3)
    ask = [{"role": "user", "content": "a"}]
    store.put(None, ask, response("r1", "A"))
    store.put("r1", [{"role": "user", "content": "b"}], response("r2", "B"))
    assert [m["content"] for m in store.conversation("r2")] == ["a", "A", "b", "B"]
    store.put(None, ask, response("r3", "C"))
    store.conversation("r1")  # used: no longer the oldest
    store.put(None, ask, response("r4", "D"))  # r2 goes: the least recently used
    assert store.get("r2") is None and store.get("r1") is not None
    store.put("r2", ask, response("r5", "E"))
    with pytest.raises(ApiError) as gone:
        store.conversation("r5")
    assert gone.value.param == "previous_response_id" and "'r2'" in gone.value.message
    small = ResponseStore(most_bytes=300)
    small.put(None, ask, response("big", "x" * 400))
    assert small.get("big") is None and small._bytes == 0
