"""The Messages API as coding agents use it (Claude Code, the Claude Agent SDK, LiteLLM's
anthropic route): a request as Claude Code sends it (Claude's model names, its attribution
line first in `system`, cache_control everywhere, thinking, tools with rich schemas, a
history of thinking, tool_use and tool_result blocks, `?beta=true`, several betas) run
whole and streamed in Anthropic's event order; pings while the prompt is read; images
among tool results said in words; mid-conversation system messages; `output_config`'s
schema held; errors, models and request ids as Anthropic's API gives them."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from engine.server import messages_api
from tests.server.conftest import KEY

anthropic = pytest.importorskip("anthropic")

BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14", "context-management-2025-06-27"]
HEADERS = {
    "x-api-key": KEY,
    "anthropic-version": "2023-06-01",
    "anthropic-beta": ",".join(BETAS),
    "user-agent": "claude-cli/2.1.42 (external, cli)",
    "x-app": "cli",
}
EPHEMERAL = {"type": "ephemeral"}
BASH = {  # as Claude Code writes its tools' schemas (zod to JSON schema)
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command"},
            "timeout": {"type": "number"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    "cache_control": EPHEMERAL,
}
LS_CALL = (
    "Listing.</think>\n\nI will look.\n\n<tool_call>\n<function=Bash>\n<parameter=command>\n"
    "ls -a\n</parameter>\n</function>\n</tool_call>"
)
ATTRIBUTION = "x-anthropic-billing-header: cc_version=2.1.42.{}; cc_entrypoint=cli; cch={};"


def claude_code_body(model: str = "claude-sonnet-4-5-20250929", cch: str = "65abc") -> dict:
    """A request as Claude Code sends it, its second tool round."""
    return {
        "model": model,
        "max_tokens": 32000,
        "temperature": 1,
        "stream": True,
        "metadata": {"user_id": "user_5f1e_account__session_7c2d"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "system": [
            {"type": "text", "text": ATTRIBUTION.format(cch[:3], cch)},
            {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
            {"type": "text", "text": "\nBe terse.", "cache_control": EPHEMERAL},
        ],
        "tools": [BASH],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>cwd /p</system-reminder>"},
                {"type": "text", "text": "list files", "cache_control": EPHEMERAL}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use ls.", "signature": "EqQBCkYIBxgC"},
                {"type": "redacted_thinking", "data": "EmwKAhgB"},
                {"type": "tool_use", "id": "toolu_01A", "name": "Bash",
                 "input": {"command": "ls"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A",
                 "content": [{"type": "text", "text": "a.txt"}]},
                {"type": "text", "text": "<system-reminder>no todos</system-reminder>"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_01B", "name": "Bash",
                 "input": {"command": "cat b"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01B", "is_error": True,
                 "content": "cat: b: No such file", "cache_control": EPHEMERAL}]},
        ],
    }  # fmt: skip


def client(served, key: str = KEY):
    return anthropic.Anthropic(base_url=served.base, api_key=key, max_retries=0)


def stream_events(served, body: dict, path: str = "/v1/messages?beta=true"):
    """(response headers, the stream's events as JSON, each checked against its SSE name)."""
    with httpx.stream("POST", served.base + path, json=body, headers=HEADERS, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line]
        headers = r.headers
    events = []
    for name, data in zip(lines[::2], lines[1::2], strict=True):
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    return headers, events


def shape(events: list[dict]) -> list[str]:
    """The stream's outline: each event by kind (and block index, block or delta type),
    repeats of one kind of delta counted once."""
    out: list[str] = []
    for e in events:
        kind = e["type"]
        if kind == "content_block_start":
            kind = f"start {e['index']} {e['content_block']['type']}"
        elif kind == "content_block_delta":
            kind = f"delta {e['index']} {e['delta']['type']}"
        elif kind == "content_block_stop":
            kind = f"stop {e['index']}"
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def test_a_claude_code_request_runs_and_streams_in_anthropics_order(scripted):
    """Claude's model name is served by the loaded model; the reply streams as thinking
    (its signature last), text and a tool_use, in the order Anthropic's API sends them."""
    scripted.scheduler.say(LS_CALL)
    headers, events = stream_events(scripted, claude_code_body())
    assert headers["request-id"].startswith("req_")
    assert shape(events) == [
        "message_start",
        "start 0 thinking", "delta 0 thinking_delta", "delta 0 signature_delta", "stop 0",
        "start 1 text", "delta 1 text_delta", "stop 1",
        "start 2 tool_use", "delta 2 input_json_delta", "stop 2",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start, delta = events[0]["message"], events[-2]
    assert start["model"] == scripted.model and start["usage"]["input_tokens"] > 0
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0
    use = next(e for e in events if e["type"] == "content_block_start" and e["index"] == 2)
    assert use["content_block"]["name"] == "Bash" and use["content_block"]["input"] == {}
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    args = "".join(d.get("partial_json", "") for d in deltas)
    assert json.loads(args) == {"command": "ls -a"}
    prompt = scripted.scheduler.last_prompt()
    assert "<tool_response>\nError: cat: b: No such file\n</tool_response>" in prompt
    assert prompt.startswith("<|im_start|>system\nYou are Claude Code.\nBe terse.")


def test_the_sdk_assembles_the_same_reply_with_its_signature(scripted):
    """The beta client (as Claude Code's: `?beta=true`, the betas as a header) assembles
    the stream; the thinking block's signature is the one a whole reply gives."""
    body = claude_code_body()
    del body["stream"]
    body["extra_body"] = {"temperature": body.pop("temperature")}  # not this client's field
    scripted.scheduler.say(LS_CALL)
    with client(scripted).beta.messages.stream(**body, betas=BETAS) as stream:
        final = stream.get_final_message()
    thinking, text, use = final.content
    assert (thinking.thinking, text.text) == ("Listing.", "I will look.")
    assert use.input == {"command": "ls -a"}
    assert final.stop_reason == "tool_use"
    scripted.scheduler.say(LS_CALL)
    whole = client(scripted).beta.messages.create(**{**body, "max_tokens": 512}, betas=BETAS)
    assert thinking.signature and whole.content[0].signature == thinking.signature
    assert whole._request_id.startswith("req_")


def test_the_attribution_line_does_not_change_the_prompt(scripted):
    """Claude Code's first system block changes every request; it is left out, so the
    prompt stays the same and the next request reads it from the prompt cache."""
    prompts, reads = [], []
    for cch in ("65abc", "0aaa9"):
        scripted.scheduler.say("Done.")
        _, events = stream_events(scripted, claude_code_body(cch=cch))
        prompts.append(scripted.scheduler.last_prompt())
        reads.append(events[-2]["usage"]["cache_read_input_tokens"])
    assert prompts[0] == prompts[1] and "billing" not in prompts[0]
    assert reads[1] > len(scripted.scheduler.prompts[-1]) / 2
    count = client(scripted).messages.count_tokens(
        model="claude-sonnet-4-5", **{k: v for k, v in claude_code_body(cch="f00d1").items()
                                     if k in ("system", "tools", "messages", "thinking")}
    )  # fmt: skip
    assert count.input_tokens == len(scripted.scheduler.prompts[-1])


def test_claude_names_are_served_and_others_are_not_found(scripted):
    scripted.scheduler.say("Hi.")
    reply = client(scripted).messages.create(
        model="claude-haiku-4-5-20251001", max_tokens=16,
        messages=[{"role": "user", "content": "Hi"}],
    )  # fmt: skip
    assert reply.model == scripted.model and reply.content[0].text == "Hi."
    with pytest.raises(anthropic.NotFoundError) as info:
        client(scripted).messages.create(
            model="gpt-4o", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]
        )
    body = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert body["request_id"] == info.value.response.headers["request-id"]


def test_pings_keep_a_stream_alive_while_the_prompt_is_read(scripted, monkeypatch):
    """No token for a while (a long prompt read, a request waiting for a slot): ping
    events go out, and the reply is whole after them."""
    monkeypatch.setattr(messages_api, "PING_S", 0.05)
    first = scripted.scheduler._first_token

    def slow(request, logits):
        time.sleep(0.4)
        return first(request, logits)

    monkeypatch.setattr(scripted.scheduler, "_first_token", slow)
    scripted.scheduler.say("Hello there!")
    body = {"model": scripted.model, "max_tokens": 32, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    _, events = stream_events(scripted, body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "ping" and kinds.count("ping") >= 3
    assert "ping" not in kinds[kinds.index("content_block_start") :]
    scripted.scheduler.say("Hello there!")
    with client(scripted).messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as s:
        assert s.get_final_message().content[0].text == "Hello there!"


def test_images_the_model_cannot_see(scripted):
    """An image among a tool's results, or in an earlier message, is said in words (the
    conversation goes on); one in the request's new message is refused, naming it."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}  # fmt: skip
    document = {
        "type": "document",
        "title": "notes.md",
        "source": {"type": "text", "media_type": "text/plain", "data": "# Notes"},
    }
    messages = [
        {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "I cannot see it; let me read the files."},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [image, document]}]},
    ]  # fmt: skip
    read = {"name": "Read", "input_schema": {"type": "object", "properties": {}}}
    scripted.scheduler.say("It is a picture.")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=16, tools=[read], messages=messages
    )
    assert reply.content[0].text == "It is a picture."
    prompt = scripted.scheduler.last_prompt()
    seen = "[an image (image/png) was here; the model reads text only and cannot see it]"
    assert f"<|im_start|>user\n{seen}What is this?<|im_end|>" in prompt
    assert f"<tool_response>\nFile: notes.md\n```markdown\n# Notes\n```\n\n{seen}" in prompt
    new = r"'messages\[0\].content\[0\]' is an image"
    with pytest.raises(anthropic.BadRequestError, match=new):
        client(scripted).messages.create(model=scripted.model, max_tokens=16,
                                         messages=messages[:1])  # fmt: skip


def test_a_system_message_mid_conversation(scripted):
    """`{"role": "system"}` in `messages` (Anthropic's mid-conversation instructions) goes
    in where it is sent; one that only sets an effort (no content) is left out."""
    scripted.scheduler.say("Oui.")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=16, system="Be brief.",
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "system", "content": []},
            {"role": "user", "content": "Ready?"},
        ],
    )  # fmt: skip
    assert reply.content[0].text == "Oui."
    prompt = scripted.scheduler.last_prompt()
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "<|im_start|>user\nAnswer in French.<|im_end|>\n<|im_start|>user\nReady?" in prompt


def test_a_final_assistant_message_is_the_start_of_the_reply(scripted):
    """Prefill: the reply goes on from the final assistant message's text (a newline it
    starts with kept), with no thinking first; count_tokens counts that text too."""
    messages = [
        {"role": "user", "content": "Write two lines."},
        {"role": "assistant", "content": [{"type": "text", "text": "First line"}]},
    ]
    scripted.scheduler.say("\nSecond line")
    c = client(scripted)
    reply = c.messages.create(
        model=scripted.model, max_tokens=16, messages=messages,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )  # fmt: skip
    assert [(b.type, b.text) for b in reply.content] == [("text", "\nSecond line")]
    prompt = scripted.scheduler.last_prompt()
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nFirst line")
    count = c.messages.count_tokens(model=scripted.model, messages=messages)
    assert count.input_tokens == len(scripted.scheduler.prompts[-1])


@pytest.mark.parametrize("how", ["output_config", "output_format"])
def test_output_config_holds_the_answer_to_its_schema(served, how):
    """`output_config.format` (Claude Code's titles ask for one), or the earlier beta's
    `output_format`: the tiny random model's answer is JSON of the schema."""
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["happy", "sad"]}},
        "required": ["ok", "mood"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "schema": schema}
    extra = {"output_config": {"format": fmt}} if how == "output_config" else {"output_format": fmt}
    reply = client(served).messages.create(
        model=served.model, max_tokens=300,
        messages=[{"role": "user", "content": "How are you?"}],
        extra_body={**extra, "temperature": 0},
    )  # fmt: skip
    value = json.loads(reply.content[0].text)
    assert set(value) == {"ok", "mood"} and value["mood"] in ("happy", "sad")
    assert reply.stop_reason == "end_turn"


def test_a_prompt_past_the_context_is_said_as_anthropics_api_says_it(scripted):
    """In the words agents read to compact: "prompt is too long: N tokens > M maximum"."""
    with pytest.raises(anthropic.BadRequestError) as info:
        client(scripted).messages.create(
            model=scripted.model, max_tokens=16,
            messages=[{"role": "user", "content": "word " * 2000}],
        )  # fmt: skip
    message = info.value.body["error"]["message"]
    assert message.startswith("prompt is too long: ") and " tokens > 1023 maximum" in message
    assert "--context" in message


def test_models_in_anthropics_shape(scripted):
    """`anthropic-version` (sent by Anthropic's clients) asks for Anthropic's shapes: the
    model list and a model; an unknown one is not_found_error. Without it, OpenAI's."""
    c = client(scripted)
    page = c.models.list()
    (model,) = page.data
    assert model.id == model.display_name == scripted.model and model.type == "model"
    assert model.created_at.year >= 2024 and model.max_input_tokens == 1024
    assert page.has_more is False and page.first_id == page.last_id == scripted.model
    assert c.models.retrieve(scripted.model).id == scripted.model
    with pytest.raises(anthropic.NotFoundError) as info:
        c.models.retrieve("nope")
    assert info.value.body["error"]["type"] == "not_found_error"
    plain = httpx.get(scripted.url + "/models", headers={"Authorization": f"Bearer {KEY}"})
    assert plain.json()["object"] == "list" and plain.json()["data"][0]["object"] == "model"


@pytest.mark.parametrize("kind", ["enabled", "adaptive", "between_tools"])
def test_each_thinking_type_that_thinks(scripted, kind):
    config = {"type": kind, "budget_tokens": 1024} if kind == "enabled" else {"type": kind}
    scripted.scheduler.say("Short.</think>\n\nHello!")
    reply = client(scripted).messages.create(
        model=scripted.model, max_tokens=64, messages=[{"role": "user", "content": "Hi"}],
        extra_body={"thinking": config},
    )  # fmt: skip
    assert [b.type for b in reply.content] == ["thinking", "text"]


@pytest.mark.parametrize(
    ("ask", "stop"),
    [
        ({"stop_sequences": ["two"]}, {"stop_reason": "stop_sequence", "stop_sequence": "two"}),
        ({"max_tokens": 2}, {"stop_reason": "max_tokens", "stop_sequence": None}),
    ],
)
def test_the_stop_reason_streams_in_message_delta(scripted, ask, stop):
    scripted.scheduler.say("one two three")
    body = {"model": scripted.model, "max_tokens": 32, "stream": True,
            "messages": [{"role": "user", "content": "Count"}], **ask}  # fmt: skip
    _, events = stream_events(scripted, body)
    assert events[-2]["delta"] == stop
