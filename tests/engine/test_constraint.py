"""A reply held to a JSON schema (engine.constraint) through `Engine.generate`, the app's
call, and the mask's rules: free while thinking, off once a pick left the grammar."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.constraint import THINK_CLOSE, THINK_OPEN, Constraint, json_grammar, opens_thinking
from engine.errors import RequestRefused
from engine.session import Engine, GenerationParams

SCHEMA = {
    "type": "object",
    "properties": {"n": {"enum": [1, 2, 3]}, "yes": {"type": "boolean"}},
    "required": ["n", "yes"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    e = Engine.load(tiny_checkpoint("untied-l8-r2", "hf-fp32"), EngineSettings(backend="numpy"))
    yield e
    e.unload()


def reply(engine: Engine, params: GenerationParams) -> tuple[str, str]:
    events = list(engine.generate(engine.tokenizer.encode("Say it"), params))
    ids = [e.token_id for e in events if e.token_id not in engine.eos_ids]
    return engine.tokenizer.decode(ids), events[-1].finish_reason


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_the_apps_call_gives_json_that_fits_the_schema(engine, temperature):
    params = GenerationParams(
        temperature=temperature, seed=5, max_new_tokens=200, grammar=json_grammar(SCHEMA, "s")
    )
    text, reason = reply(engine, params)
    value = json.loads(text)
    assert reason == "stop" and value["n"] in (1, 2, 3) and isinstance(value["yes"], bool), text


def test_a_held_reply_is_picked_on_the_host(engine):
    sampler = engine._sampler(GenerationParams(temperature=0, grammar=json_grammar(None, "s")), [1])
    assert not sampler.takes_argmax and not sampler.on_device
    assert engine._sampler(GenerationParams(temperature=0), [1]).takes_argmax


def test_unheld_replies_are_unchanged(engine):
    params = GenerationParams(temperature=0, max_new_tokens=12)
    assert reply(engine, params) == reply(engine, params)


def _constraint(engine: Engine, think_end: int | None) -> Constraint:
    llt = engine.grammar_tokenizer.get()
    return Constraint(json_grammar(SCHEMA, "s"), llt, sorted(engine.eos_ids), think_end)


def test_the_mask_waits_for_the_end_of_thinking(engine):
    tok = engine.tokenizer
    end = tok.token_to_id(THINK_CLOSE)
    c = _constraint(engine, end)
    scores = np.zeros(engine.vocab_rows, np.float32)
    c.mask(scores, tok.encode("hmm, {"))
    assert np.isfinite(scores).all()  # still thinking: every token may come
    c.mask(scores, [*tok.encode("hmm"), end])
    allowed = np.flatnonzero(np.isfinite(scores))
    assert 0 < allowed.size < 100
    assert all(tok.decode([int(i)]).strip() in ("", "{") for i in allowed)


def test_a_pick_outside_the_grammar_lets_go_and_says_so(engine, caplog):
    c = _constraint(engine, None)
    scores = np.zeros(engine.vocab_rows, np.float32)
    with caplog.at_level(logging.WARNING, logger="engine.constraint"):
        c.mask(scores, engine.tokenizer.encode("plain words"))
    assert np.isfinite(scores).all() and c.broken and "left its grammar" in caplog.text


def test_a_complete_reply_may_only_end(engine):
    c = _constraint(engine, None)
    scores = np.zeros(engine.vocab_rows, np.float32)
    c.mask(scores, engine.tokenizer.encode('{"n": 2, "yes": true}'))
    allowed = set(np.flatnonzero(np.isfinite(scores)).tolist())
    assert allowed and allowed <= set(engine.eos_ids), allowed


def test_the_prompt_says_whether_the_reply_starts_in_thinking(engine):
    tok = engine.tokenizer
    open_, close = tok.token_to_id(THINK_OPEN), tok.token_to_id(THINK_CLOSE)
    assert opens_thinking([5, open_, 9], tok)
    assert not opens_thinking([5, open_, 9, close, 7], tok) and not opens_thinking([5], tok)


@pytest.mark.parametrize("schema", [{"type": "nonsense"}, {"properties": {"a": {"type": 3}}}])
def test_a_schema_that_does_not_compile_is_refused_by_name(schema):
    with pytest.raises(RequestRefused, match="'response_format.x' is not a usable JSON schema"):
        json_grammar(schema, "response_format.x")
