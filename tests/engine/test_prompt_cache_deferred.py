"""Saves inside a request (its prompt's turn start, its prompt's end) whose state no memory
tier keeps: the disk copy is still written, so the next turn, or the chat after a restart,
resumes from it (the numpy backend's "device" tier is sized by HOST_PROMPT_CACHE_BYTES)."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine.session as session
from engine.session import Engine
from tests.engine.test_prompt_cache_tiers import load, on_disk, prompt, tokens


@pytest.fixture(scope="module")
def model(tiny_checkpoint) -> Path:
    return tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")


def _chat_turn(engine: Engine) -> tuple[list[int], int]:
    """A prompt whose last turn begins (an <|im_start|>) at 30 of its 45 tokens, whose
    greedy reply runs past its first token: (ids, its turn start)."""
    ids = prompt(45, seed=21)
    ids[30] = engine.tokenizer.token_to_id("<|im_start|>")
    ids = [t if t != ids[30] or i == 30 else t + 1 for i, t in enumerate(ids)]
    assert engine.turn_start(ids) == 30
    return ids, 30


def _resumes_from_disk(model, settings, ids: list[int], start: int) -> None:
    """A new engine (a restart) resumes the next turn from the turn start, from disk, and
    replies as a fresh engine does."""
    engine = load(model, settings)
    follow = ids[:start] + prompt(20, seed=22)
    assert engine.prompt_cache.where(follow) == ("disk", tuple(ids[:start]))
    assert tokens(engine, follow) == tokens(load(model), follow)
    assert engine.prompt_cache.stats.hits["disk"] == 1
    engine.unload()


def test_a_turn_start_no_memory_tier_keeps_is_written_to_disk(model, monkeypatch, tmp_path):
    monkeypatch.setattr(session, "HOST_PROMPT_CACHE_BYTES", 0)  # no "device" tier
    settings = on_disk(tmp_path, prompt_cache_host_bytes=0)  # no host tier
    engine = load(model, settings)
    ids, start = _chat_turn(engine)
    assert len(tokens(engine, ids)) > 1
    engine.unload()
    assert len(engine.prompt_cache) == 0  # nothing in memory: the disk has each state
    _resumes_from_disk(model, settings, ids, start)


def test_a_turn_start_moved_out_inside_its_reply_is_written_to_disk(model, monkeypatch, tmp_path):
    """Room for one state on the "device", none in host memory: the prompt's end, saved
    inside the reply, evicts its turn start, whose disk copy waited for the reply's end."""
    probe = load(model)
    ids, start = _chat_turn(probe)
    assert len(tokens(probe, ids)) > 1
    one = probe.prompt_cache.device.lookup(ids + [0]).nbytes  # the prompt's end
    monkeypatch.setattr(session, "HOST_PROMPT_CACHE_BYTES", one + one // 10)
    settings = on_disk(tmp_path, prompt_cache_host_bytes=0)
    engine = load(model, settings)
    tokens(engine, ids)
    assert tuple(ids[:start]) not in engine.prompt_cache.device  # moved out inside the reply
    engine.unload()
    _resumes_from_disk(model, settings, ids, start)
