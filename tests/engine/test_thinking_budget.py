"""A reply's thinking held to a budget (engine/thinking_budget.py): stopped at the budget,
closed with Qwen's words for it, the answer read on from the saved state; a reply that
closes its own thinking, a cancel, and the token limit are left as they were."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from engine.config import EngineSettings
from engine.request_types import GenerationParams, GenerationStats, TokenEvent
from engine.session import Engine
from engine.thinking_budget import CLOSE, applies, generate_within
from tests.server.conftest import with_template

NUMPY = EngineSettings(backend="numpy")


class Words:
    """A tokenizer of one token a word (ids from 1), `</think>` among them."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids) + 1) for w in text.split(" ") if w]

    def token_to_id(self, text: str) -> int:
        return self.encode(text)[0]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        words = {i: w for w, i in self.ids.items()}
        return " ".join(words.get(i, "?") for i in ids)  # a prompt's ids it never gave


@dataclass
class Scripted:
    """Stands in for Engine: each call of `generate` says the next script's words, one
    token each, and stops as Engine does (cancel seen after a token, the token limit)."""

    scripts: list[list[str]]
    tokenizer: Words = field(default_factory=Words)
    calls: list[tuple[list[int], int]] = field(default_factory=list)
    params: list[GenerationParams] = field(default_factory=list)

    def generate(self, ids, params, cancel=None, **_):
        self.calls.append((list(ids), params.max_new_tokens))
        self.params.append(params)
        words = self.scripts[len(self.calls) - 1]
        for n, word in enumerate(words, 1):
            token = self.tokenizer.encode(word)[0]
            reason = None
            if n == len(words):
                reason = "stop"
            elif n >= params.max_new_tokens:
                reason = "length"
            elif cancel is not None and cancel.is_set():
                reason = "cancelled"
            if reason:
                stats = GenerationStats(len(ids), n, 0.5, 100.0, 10.0, cached_tokens=3)
                yield TokenEvent(token, word + " ", True, reason, stats)
                return
            yield TokenEvent(token, word + " ")


def run(engine, budget, params=None, cancel=None, prompt=(1, 2, 3)):
    params = params or GenerationParams(max_new_tokens=100)
    return list(generate_within(engine, list(prompt), params, budget, cancel))


def text(events) -> str:
    return "".join(e.text for e in events)


def test_a_reply_that_closes_its_thinking_in_time_is_not_touched():
    engine = Scripted([["hmm", "yes", "</think>", "Paris", "."]])
    events = run(engine, budget=4)
    assert text(events) == "hmm yes </think> Paris . " and len(engine.calls) == 1
    assert events[-1].finish_reason == "stop" and events[-1].stats.new_tokens == 5
    assert events[-1].stats.thinking_cut == 0  # not closed by the budget


def test_at_the_budget_the_thinking_is_closed_and_the_answer_follows():
    engine = Scripted([["a", "b", "c", "d", "e", "f"], ["Paris", "."]])
    events = run(engine, budget=4)
    # The third token sets the stop; the reply ends at its next (the fourth, the budget's
    # last), as Engine's does after a cancel; then the closing words; then the answer.
    assert text(events) == "a b c d " + CLOSE + "Paris . "
    assert [e.finished for e in events].count(True) == 1 and events[-1].finish_reason == "stop"
    (prompt, most), (again, rest) = engine.calls
    close = engine.tokenizer.encode(CLOSE)
    assert again == prompt + engine.tokenizer.encode("a b c d") + close
    assert rest == 100 - 4 - len(close)
    # the penalties of the second part count the thinking and the closing words
    assert engine.params[1].earlier == tuple(engine.tokenizer.encode("a b c d") + close)
    stats = events[-1].stats
    assert stats.new_tokens == 4 + len(close) + 2 and stats.prompt_tokens == 3
    assert stats.ttft_s == 0.5 and stats.cached_tokens == 3  # the first part's prompt
    assert stats.thinking_cut == 4  # the budget the closing words came at
    said = events[4 : 4 + len(close)]  # the closing words: a token an event, as the model's
    assert [e.token_id for e in said] == close and not any(e.finished for e in said)


def test_a_cancel_or_the_token_limit_ends_the_reply_there():
    cancel = threading.Event()
    cancel.set()
    engine = Scripted([["a", "b", "c", "d"], ["never"]])
    events = run(engine, budget=1, cancel=cancel)
    assert text(events) == "a " and events[-1].finish_reason == "cancelled"
    assert len(engine.calls) == 1
    engine = Scripted([["a", "b", "c", "d", "e"], ["never"]])
    close = len(Words().encode(CLOSE))
    events = run(engine, budget=2, params=GenerationParams(max_new_tokens=2 + close))
    assert events[-1].finish_reason == "length" and len(engine.calls) == 1
    assert text(events) == "a b " + CLOSE and events[-1].stats.new_tokens == 2 + close
    # a limit that falls inside the closing words cuts them there: never past the limit
    engine = Scripted([["a", "b", "c", "d", "e"], ["never"]])
    events = run(engine, budget=2, params=GenerationParams(max_new_tokens=5))
    assert text(events) == "a b " + " ".join(CLOSE.split(" ")[:3]) and len(engine.calls) == 1
    assert events[-1].finish_reason == "length" and events[-1].stats.new_tokens == 5


def test_a_reply_gone_on_with_has_spent_part_of_its_budget():
    """Continue inside the thinking: the tokens thought already count (`spent`); at least
    one more comes; the stats name the whole budget."""
    engine = Scripted([["c", "d", "e", "f"], ["Paris"]])
    events = list(generate_within(engine, [1], GenerationParams(max_new_tokens=100), 4, None, 2))
    assert text(events) == "c d " + CLOSE + "Paris " and events[-1].stats.thinking_cut == 4
    engine = Scripted([["c", "d"], ["Paris"]])
    events = list(generate_within(engine, [1], GenerationParams(max_new_tokens=100), 4, None, 9))
    assert text(events) == "c " + CLOSE + "Paris "  # spent already: one token, then closed


def test_a_reply_cut_inside_the_closing_words_goes_on_with_their_rest():
    """Continue after the token limit fell inside the closing words: their rest goes in
    first, without a token of the model's before it, and the answer follows; the words are
    said once. A thinking that ends in a blank line of its own is no start of them."""
    words = Words()
    cut = " ".join(CLOSE.split(" ")[:3])  # "\n\nConsidering the limited"
    prompt = words.encode("a b") + words.encode(cut)
    engine = Scripted([["Paris"]], tokenizer=words)
    params = GenerationParams(max_new_tokens=100)
    events = list(generate_within(engine, prompt, params, 4, None, 9))
    rest = words.encode(CLOSE[len(cut) :])
    assert engine.calls == [(prompt + rest, 100 - len(rest))]
    said = words.decode(prompt[2:] + [e.token_id for e in events if e.token_id > 0])
    assert said.split() == CLOSE.split() + ["Paris"]
    assert events[-1].text == "Paris " and events[-1].stats.thinking_cut == 4
    blank = Scripted([["c", "d"], ["Paris"]], tokenizer=words)
    events = list(generate_within(blank, words.encode("a \n\n"), params, 4, None, 9))
    assert text(events) == "c " + CLOSE + "Paris "  # one token of the model's, then closed


def test_the_last_token_before_the_stop_may_close_the_thinking_itself():
    engine = Scripted([["a", "b", "</think>", "x"], ["Paris"]])
    events = run(engine, budget=3)
    assert text(events) == "a b </think> Paris " and CLOSE not in text(events)
    assert events[-1].stats.thinking_cut == 0  # the model closed it, not the budget


@pytest.fixture(scope="module")
def thinker(tiny_checkpoint, tmp_path_factory):
    source = tiny_checkpoint("untied-l8-r2", "hf-fp32")
    return with_template(source, tmp_path_factory.mktemp("budget") / "tiny")


def test_on_the_engine_the_answer_goes_on_from_the_saved_state(thinker, monkeypatch):
    """The numpy engine: the reply past the budget is the thinking, the closing words, and
    what the engine answers to the prompt with those (greedy, as a fresh engine gives it);
    the second part reads only the closing words, the rest restored from the saved state."""
    engine = Engine.load(thinker, NUMPY, context=512, streams=1, max_rows=64)
    ids = engine.chat_ids([{"role": "user", "content": "Why?"}], enable_thinking=True)
    assert applies(engine, ids, 5) and not applies(engine, ids, 0)
    plain = engine.chat_ids([{"role": "user", "content": "Why?"}], enable_thinking=False)
    assert not applies(engine, plain, 5)
    parts = []
    real = engine.generate

    def spy(*args, **kwargs):
        for event in real(*args, **kwargs):
            if event.finished:
                parts.append(event.stats)
            yield event

    monkeypatch.setattr(engine, "generate", spy)
    params = GenerationParams(max_new_tokens=120, greedy=True)
    events = list(generate_within(engine, ids, params, 5))
    first = [e.token_id for e in events[:5]]  # the five thinking tokens of the budget
    close = engine.tokenizer.encode(CLOSE)
    assert [e.token_id for e in events[5 : 5 + len(close)]] == close
    assert "".join(e.text for e in events[5 : 5 + len(close)]) == CLOSE
    answer = [e.token_id for e in events[5 + len(close) :]]
    assert len(first) + len(close) + len(answer) == 120 and events[-1].finish_reason == "length"
    assert events[-1].stats.new_tokens == 120 and len(answer) > 20
    # The second part restored the prompt and the thinking, and read the closing words.
    assert parts[1].cached_tokens >= len(ids) + len(first) - 1
    assert parts[1].prompt_tokens == len(ids) + len(first) + len(close)
    monkeypatch.undo()
    fresh = Engine.load(thinker, NUMPY, context=512, streams=1, max_rows=64)
    rest = GenerationParams(max_new_tokens=len(answer), greedy=True)
    again = [e.token_id for e in fresh.generate(ids + first + close, rest)]
    assert again == answer


def test_through_the_scheduler_as_the_app_runs_it_beside_its_server(thinker):
    """The app's chat beside `snug serve` goes through a ScheduledEngine: the budget holds
    there too (the scheduler's request cancelled through the budget's stop)."""
    from engine.scheduled_engine import ScheduledEngine

    scheduled = ScheduledEngine(Engine.load(thinker, NUMPY, context=512, streams=2, max_rows=64))
    try:
        ids = scheduled.chat_ids([{"role": "user", "content": "Why?"}], enable_thinking=True)
        assert applies(scheduled, ids, 5)
        params = GenerationParams(max_new_tokens=120, greedy=True)
        events = list(generate_within(scheduled, ids, params, 5))
        reply = "".join(e.text for e in events)
        assert CLOSE in reply and reply.split(CLOSE)[1]
        assert events[-1].finished and events[-1].stats.new_tokens == 120
        assert not scheduled.scheduler.running and not scheduled.scheduler.waiting
    finally:
        scheduled.unload()
