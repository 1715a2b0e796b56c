"""A thinking budget asked of the server: `thinking_budget` (as Qwen's own API names it) on
the chat API, `thinking.budget_tokens` on Anthropic's. The reply is what the engine gives
with its thinking held to that budget (engine/thinking_budget.py), whole or streamed."""

import json

import anthropic
import httpx
import pytest

from engine.session import GenerationParams
from engine.thinking_budget import CLOSE, generate_within
from tests.server.conftest import KEY

USER = [{"role": "user", "content": "Hello"}]
ON = {"chat_template_kwargs": {"enable_thinking": True}}
WORDS = CLOSE.split("</think>")[0].strip()  # the closing words, as the thinking ends


def held(solo, budget: int, max_tokens: int, penalty: float = 0.0) -> tuple[str, str]:
    """(thinking, answer) of the reply the engine alone gives under the budget (greedy,
    with that presence penalty)."""
    engine = solo.engine
    ids = engine.chat_ids(USER, enable_thinking=True)
    params = GenerationParams(max_new_tokens=max_tokens, greedy=True, presence_penalty=penalty)
    text = "".join(e.text for e in generate_within(engine, ids, params, budget))
    thinking, _, rest = text.partition("</think>")
    return thinking.strip(), rest.strip()


def test_the_chat_api_holds_the_thinking_to_its_budget(served, solo):
    thinking, answer = held(solo, 6, 90)
    if not thinking.endswith(WORDS):
        pytest.skip("the tiny model closed its thinking within the budget")
    client = served.client()
    body = {**ON, "thinking_budget": 6}
    reply = client.chat.completions.create(
        model=served.model, messages=USER, max_tokens=90, temperature=0, extra_body=body
    )
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"].strip() == thinking
    assert (message.content or "").strip() == answer
    assert reply.usage.completion_tokens == 90 and reply.choices[0].finish_reason == "length"
    # The thinking counts up to the closing words' last token.
    assert 6 < reply.usage.completion_tokens_details.reasoning_tokens < 90
    stream = client.chat.completions.create(
        model=served.model, messages=USER, max_tokens=90, temperature=0, extra_body=body,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    reasoning, content, usage = "", "", None
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += delta.model_extra.get("reasoning_content") or ""
            content += delta.content or ""
        usage = chunk.usage or usage
    assert reasoning.strip() == thinking and content.strip() == answer
    assert usage.completion_tokens == 90
    served.wait_idle()


def test_the_penalty_counts_the_thinking_on_both_sides_of_the_cut(served, solo, monkeypatch):
    """A presence penalty goes on counting the thinking after the cut, on the server as on
    the engine's path: the second request counts the first's tokens and the closing words,
    and the two replies are the same."""
    thinking, answer = held(solo, 6, 120, penalty=1.5)
    if not thinking.endswith(WORDS):
        pytest.skip("the tiny model closed its thinking within the budget")
    asked = []
    submit = served.scheduler.submit
    monkeypatch.setattr(
        served.scheduler, "submit", lambda ids, params, **kw: asked.append((ids, params))
        or submit(ids, params, **kw),
    )  # fmt: skip
    reply = served.client().chat.completions.create(
        model=served.model, messages=USER, max_tokens=120, temperature=0, presence_penalty=1.5,
        extra_body={**ON, "thinking_budget": 6},
    )  # fmt: skip
    message = reply.choices[0].message
    assert message.model_extra["reasoning_content"].strip() == thinking
    assert (message.content or "").strip() == answer
    (prompt, first), (again, second) = asked
    assert first.earlier == () and second.earlier == tuple(again[len(prompt) :])
    assert len(second.earlier) > 6 and second.presence_penalty == 1.5
    # a limit inside the closing words holds: they are cut there, as the engine's path cuts
    short = served.client().chat.completions.create(
        model=served.model, messages=USER, max_tokens=12, temperature=0,
        extra_body={**ON, "thinking_budget": 6},
    )  # fmt: skip
    assert short.usage.completion_tokens == 12 and short.choices[0].finish_reason == "length"
    assert short.choices[0].message.model_extra["reasoning_content"].strip() == held(solo, 6, 12)[0]
    served.wait_idle()


def test_anthropic_budget_tokens_hold_the_thinking(served, solo):
    thinking, answer = held(solo, 8, 90)
    if not thinking.endswith(WORDS):
        pytest.skip("the tiny model closed its thinking within the budget")
    client = anthropic.Anthropic(base_url=served.base, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model=served.model, max_tokens=90, messages=USER, extra_body={"temperature": 0},
        thinking={"type": "enabled", "budget_tokens": 8},
    )  # fmt: skip
    blocks = {b.type: b for b in message.content}
    assert blocks["thinking"].thinking.strip() == thinking
    assert blocks.get("text") is None or blocks["text"].text.strip() == answer
    assert message.usage.output_tokens == 90
    refused = httpx.post(
        f"{served.base}/v1/messages",
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
        json={
            "model": served.model, "max_tokens": 20, "messages": USER,
            "thinking": {"type": "enabled", "budget_tokens": -3},
        },
    )  # fmt: skip
    assert refused.status_code == 400
    error = json.loads(refused.text)["error"]
    assert "'thinking.budget_tokens'" in error["message"]


def test_without_thinking_the_budget_changes_nothing(served, solo):
    client = served.client()
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    plain = client.chat.completions.create(
        model=served.model, messages=USER, max_tokens=20, temperature=0, extra_body=off
    )
    held_off = client.chat.completions.create(
        model=served.model, messages=USER, max_tokens=20, temperature=0,
        extra_body={**off, "thinking_budget": 3},
    )  # fmt: skip
    assert held_off.choices[0].message.content == plain.choices[0].message.content
    assert WORDS not in (held_off.choices[0].message.content or "")


def test_the_servers_own_budget_holds_requests_that_name_none(served, solo):
    """`snug serve --thinking-budget N` (create_app's `thinking_budget`): a request that
    names no budget is held to N; one that names its own keeps it."""
    import openai

    from engine.server.app import create_app
    from engine.server.runner import ServerThread

    thinking, answer = held(solo, 6, 90)
    if not thinking.endswith(WORDS):
        pytest.skip("the tiny model closed its thinking within the budget")
    server = ServerThread(create_app(served.scheduler, api_key=KEY, thinking_budget=6)).start()
    try:
        client = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)
        reply = client.chat.completions.create(
            model=served.model, messages=USER, max_tokens=90, temperature=0, extra_body=ON
        )
        assert reply.choices[0].message.model_extra["reasoning_content"].strip() == thinking
        own = client.chat.completions.create(
            model=served.model, messages=USER, max_tokens=90, temperature=0,
            extra_body={**ON, "thinking_budget": 9},
        )  # fmt: skip
        own_thinking = own.choices[0].message.model_extra["reasoning_content"]
        assert own_thinking.strip() == held(solo, 9, 90)[0]
    finally:
        server.stop()
