"""A reply with thinking, words and calls comes back the same streamed as whole, in each API's
shape: OpenAI's chat (deltas joined), Anthropic's Messages (blocks rebuilt from their
events), the Responses API (the completed event's output) and Ollama's chat (lines
joined); among them a call Qwen3.5 wrote before closing its thinking, and two calls with
words between and after them."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import KEY, WEATHER_PARAMETERS

CALL = (
    '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis 日本 "q" <b>\n</parameter>\n'
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
)
REPLIES = [
    f"Think é.\n{CALL}\n</think>\n\nAfter.",
    f"Think.\n</think>\n\nLet me look.\n\n{CALL}\n{CALL.replace('Paris', 'Rome')}\nTail.",
]
HEADERS = {"Authorization": f"Bearer {KEY}"}
ASK = [{"role": "user", "content": "Weather?"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}}


def events(response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def both(served, reply, path, body, read_whole, read_stream, stream_key="stream"):
    """(the reply read whole, the reply read from its stream), each as `read_*` gives it."""
    served.scheduler.say(reply)
    whole = httpx.post(served.base + path, json={**body, stream_key: False}, headers=HEADERS,
                       timeout=60)  # fmt: skip
    served.scheduler.say(reply)
    with httpx.stream("POST", served.base + path, json={**body, stream_key: True},
                      headers=HEADERS, timeout=60) as streamed:  # fmt: skip
        return read_whole(whole.json()), read_stream(streamed)


def calls_of(pairs):
    return [(name, json.loads(args) if isinstance(args, str) else args) for name, args in pairs]


@pytest.mark.parametrize("reply", REPLIES)
def test_openai_chat(scripted, reply):
    def whole(body):
        m = body["choices"][0]["message"]
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
        return m.get("reasoning_content") or "", m.get("content") or "", calls_of(calls)

    def streamed(response):
        reasoning, content, calls = "", "", {}
        for chunk in events(response):
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(part["index"], ["", ""])
                call[0] += part["function"].get("name") or ""
                call[1] += part["function"].get("arguments") or ""
        return reasoning, content, calls_of(calls.values())

    body = {"model": scripted.model, "messages": ASK, "tools": [TOOL], "max_tokens": 300}
    got, want = both(scripted, reply, "/v1/chat/completions", body, whole, streamed)
    assert got == want and len(got[2]) == reply.count("<tool_call>")


@pytest.mark.parametrize("reply", REPLIES)
def test_anthropic_messages(scripted, reply):
    def streamed(response):
        blocks = []
        for event in events(response):
            if event["type"] == "content_block_start":
                blocks.append({**event["content_block"]})
                if blocks[-1]["type"] == "tool_use":
                    blocks[-1]["input"] = ""
            elif event["type"] == "content_block_delta":
                block, delta = blocks[event["index"]], event["delta"]
                for kind, key in (("text_delta", "text"), ("thinking_delta", "thinking"),
                                  ("input_json_delta", "partial_json")):  # fmt: skip
                    if delta["type"] == kind:
                        block["input" if key == "partial_json" else key] += delta[key]
        for block in blocks:
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["input"] or "{}")
        return shown(blocks)

    def shown(blocks):
        return [{k: v for k, v in b.items() if k not in ("id", "signature")} for b in blocks]

    tool = {"name": "get_weather", "input_schema": WEATHER_PARAMETERS}
    body = {"model": scripted.model, "messages": ASK, "max_tokens": 300, "tools": [tool],
            "thinking": {"type": "enabled", "budget_tokens": 1024}}  # fmt: skip
    got, want = both(scripted, reply, "/v1/messages", body, lambda b: shown(b["content"]), streamed)
    assert got == want
    assert [b["type"] for b in got].count("tool_use") == reply.count("<tool_call>")


@pytest.mark.parametrize("reply", REPLIES)
def test_responses(scripted, reply):
    def shown(output):
        return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]

    def streamed(response):
        done = [e for e in events(response) if e["type"] == "response.completed"]
        return shown(done[0]["response"]["output"])

    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS}
    body = {"model": scripted.model, "input": "Weather?", "tools": [tool]}
    got, want = both(scripted, reply, "/v1/responses", body, lambda b: shown(b["output"]), streamed)
    assert got == want
    assert [i["type"] for i in got].count("function_call") == reply.count("<tool_call>")


@pytest.mark.parametrize("reply", REPLIES)
def test_ollama_chat(scripted, reply):
    def read(message):
        calls = [
            (c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls") or []
        ]
        return message.get("thinking", ""), message.get("content", ""), calls

    def streamed(response):
        thinking, content, calls = "", "", []
        for line in filter(None, response.iter_lines()):
            part = read(json.loads(line).get("message") or {})
            thinking, content, calls = thinking + part[0], content + part[1], calls + part[2]
        return thinking, content, calls

    body = {"model": scripted.model, "messages": ASK, "tools": [TOOL], "think": True}
    got, want = both(scripted, reply, "/api/chat", body, lambda b: read(b["message"]), streamed)
    assert got == want and len(got[2]) == reply.count("<tool_call>")
