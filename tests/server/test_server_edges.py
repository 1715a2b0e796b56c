"""Edge cases real clients send: a null or ill-typed field where a string or a list belongs,
a JavaScript client's lone UTF-16 surrogate (a string cut inside an emoji), the limit named
as it was sent, Ollama's `context` after a stop string, and completions' text offsets
past characters split across tokens."""

from __future__ import annotations

import time

import httpx
import ollama
import pytest

from engine.scheduler import Scheduler
from engine.server.generation import Generation
from tests.server.conftest import KEY, Scripted, serve

AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def post(served, route: str, body: dict | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else httpx.Request("POST", "/", json=body).content
    return httpx.post(f"{served.base}{route}", content=content, headers=AUTH, timeout=30)


def test_a_null_or_ill_typed_field_is_a_400_that_names_it(served):
    user = {"role": "user", "content": "hi"}
    for route, body, param in (
        ("/tokenize", {"prompt": None}, "prompt"),
        ("/tokenize", {"content": None}, "content"),
        ("/api/chat", {"model": served.model, "messages": [{**user, "tool_calls": 5}]},
         "messages[0].tool_calls"),
        ("/api/chat", {"model": served.model, "messages": [{**user, "tool_calls": True}]},
         "messages[0].tool_calls"),
        ("/api/chat", {"model": served.model, "messages": [user],
                       "options": {"num_predict": "x"}}, "options.num_predict"),
    ):  # fmt: skip
        got = post(served, route, body)
        assert got.status_code == 400, (route, body, got.text)
        error = got.json()["error"]
        assert f"'{param}'" in (error if isinstance(error, str) else error["message"])


def test_the_limit_is_named_as_the_request_sent_it(served):
    chat = {"model": served.model, "messages": [{"role": "user", "content": "hi"}]}
    for value, words in ((0, "at least 1"), (5000, "ask for at most")):
        got = post(served, "/v1/chat/completions", {**chat, "max_completion_tokens": value})
        assert got.status_code == 400
        error = got.json()["error"]
        assert error["param"] == "max_completion_tokens" and words in error["message"]
        assert error["message"].lstrip("'").startswith("max_completion_tokens")


def test_a_lone_surrogate_reads_as_a_replacement_character(scripted):
    """JSON lets a string hold "\\ud83d" alone (a JavaScript client that cut a string inside
    an emoji sends it): it is read as U+FFFD, as Go's JSON (Ollama's) reads it, not a 500."""
    scripted.scheduler.say("Fine.")
    user = b'[{"role": "user", "content": "cut \\ud83d here"}]'
    chat = b'{"max_tokens": 4, "messages": ' + user + b"}"
    for route in ("/v1/chat/completions", "/v1/messages"):
        scripted.scheduler.say("Fine.")
        got = post(scripted, route, chat)
        assert got.status_code == 200, (route, got.text)
        assert "cut \ufffd here" in scripted.scheduler.last_prompt()
    scripted.scheduler.say("Fine.")
    got = post(scripted, "/v1/completions", b'{"max_tokens": 2, "prompt": "a\\udc00b"}')
    assert got.status_code == 200 and scripted.scheduler.last_prompt() == "a\ufffdb"
    named_body = b'{"model": "m\\ud800", "messages": ' + user + b"}"
    named = post(scripted, "/v1/chat/completions", named_body)
    assert named.status_code == 404 and "'m\ufffd'" in named.json()["error"]["message"]


def test_generate_gives_back_the_tokens_of_the_reply_it_sent(scripted, monkeypatch):
    """After a stop string, `context` is the prompt and the tokens the reply was read from,
    not those the engine ran ahead with before the cancel reached it."""
    cancel = Generation.cancel

    def slow_cancel(self):  # the engine goes on a while, as it may on any machine
        time.sleep(0.3)
        cancel(self)

    monkeypatch.setattr(Generation, "cancel", slow_cancel)
    c = ollama.Client(host=scripted.base, headers={"Authorization": f"Bearer {KEY}"})
    for stream in (False, True):
        scripted.scheduler.say("Hello there! " + "and more " * 60)
        kw = dict(options={"stop": ["there"], "num_predict": 400}, think=False)
        got = c.generate(model=scripted.model, prompt="Hi", stream=stream, **kw)
        last = list(got)[-1] if stream else got
        prompt = scripted.scheduler.prompts[-1]
        context = list(last.context)
        assert len(context) == last.prompt_eval_count + last.eval_count
        assert context[: len(prompt)] == prompt
        said = scripted.engine.tokenizer.decode(context[len(prompt) :])
        assert said.startswith("Hello there") and "more" not in said


class Scored(Scripted):
    """Scripted, with the first token's log-probabilities drawn as the later ones' are."""

    def _first_token(self, request, logits) -> int:
        Scheduler._first_token(self, request, logits)
        return super()._first_token(request, logits)


@pytest.fixture(scope="module")
def scored(light_checkpoint):
    s = serve(light_checkpoint, Scored, streams=1, queue=2)
    yield s
    s.server.stop()
    s.scheduler.close()


def test_text_offsets_index_the_text_past_split_characters(scored):
    """A character the tokenizer cuts into bytes (emoji, CJK) starts where its first piece
    does; the tokens after it start where they are in the text."""
    text = "😀😀 日本 é done"
    scored.scheduler.say(text)
    reply = scored.client().completions.create(
        model=scored.model, prompt="x", max_tokens=60, logprobs=0
    )
    choice = reply.choices[0]
    assert choice.text == text
    lp = choice.logprobs
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[-1] < len(text)
    whole = [(t, at) for t, at in zip(lp.tokens, lp.text_offset, strict=True) if "\ufffd" not in t]
    assert whole and all(text[at:].startswith(t) for t, at in whole)
    assert text[lp.text_offset[-1] :] == lp.tokens[-1]
    assert lp.text_offset[:7] == [0, 0, 0, 1, 1, 1, 2]  # 😀 is three tokens here
