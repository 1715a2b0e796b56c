"""tools/soak.py on the CPU: a short soak through the server on a tiny numpy model passes,
its mix is what the docstring says, and its verdict catches a leak, a changed probe and
an unexpected error (the figures that count come from the GPU: docs/reliability.md)."""

from __future__ import annotations

import json
from argparse import Namespace
from collections import Counter

import numpy as np

from tools.soak import CARD_SLACK, plan_requests, verdict


def test_a_short_soak_through_the_server_passes(tiny_checkpoint, tmp_path):
    from tools.soak import main

    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    argv = [
        "--backend", "numpy", "--model", str(model), "--requests", "20", "--clients", "3",
        "--streams", "2", "--context", "256", "--max-prompt", "96", "--max-tokens", "6",
        "--every", "10", "--out", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    record = json.loads((tmp_path / "soak.json").read_text())
    outcomes = record["outcomes"]
    assert sum(outcomes.values()) == 20 and record["errors"] == {} and record["problems"] == []
    assert outcomes["refused: context_length_exceeded"] == 1
    assert outcomes.get("cancelled", 0) + outcomes.get("ended before the cancel", 0) == 1
    assert [c["after"] for c in record["checkpoints"]] == [
        "load",
        "10 requests",
        "20 requests",
        "the end, prompt cache emptied",
    ]
    assert record["probe_replies"] == 1 and record["checkpoints"][2]["prompt_cache_states"] > 0


def test_the_mix_of_requests():
    args = Namespace(max_prompt=6000, max_tokens=32, vocab=400)
    items = plan_requests(1000, 100, 8192, args, np.random.default_rng(0))
    kinds = Counter(p.kind for p in items)
    assert kinds["over"] == 30 and kinds["cancel"] == 50 and 80 <= kinds["follow"] <= 100
    for p in items:
        if p.kind == "over":
            assert len(p.prompt) >= 8192
        else:
            assert 1 <= p.max_tokens <= 32 and len(p.prompt) + p.max_tokens < 8192
    for p in (p for p in items if p.kind == "follow"):
        origins = [o for o in items[: p.index - p.index % 100] if o.kind == "plain"]
        assert any(p.prompt[: len(o.prompt)] == o.prompt for o in origins)
    lengths = [len(p.prompt) for p in items if p.kind in ("plain", "cancel")]
    assert min(lengths) >= 16 and max(lengths) > 2048 and np.median(lengths) < 512
    assert all(p.cancel_after in (1, 2) for p in items if p.kind == "cancel")


def _reading(after: str, fixed: int, saved: int = 0, card: int = 10 << 30, rss: int = 0) -> dict:
    by = {"weights": fixed, "scratch": 100, "workspace": 50, "prompt_cache": saved}
    return {
        "after": after,
        "pool_held": sum(by.values()),
        "pool_by_category": by,
        "engine_held": sum(by.values()),
        "prompt_cache_bytes": saved,
        "card_used": card,
        "rss": rss,
    }


def test_the_verdict_catches_a_leak_a_changed_probe_and_an_error():
    flat = [_reading("load", 1000), _reading("100", 1000, 300), _reading("end", 1000)]
    assert verdict(flat, Counter(), {"same reply"}) == []
    leak = [_reading("load", 1000), _reading("100", 1000), _reading("end", 1256)]
    assert any("1,256 bytes" in p for p in verdict(leak, Counter(), {"x"}))
    card = [_reading("load", 1000), _reading("100", 1000), _reading("end", 1000, card=11 << 30)]
    assert any("card's used memory grew" in p for p in verdict(card, Counter(), {"x"}))
    within = _reading("end", 1000, card=(10 << 30) + CARD_SLACK)
    assert verdict([flat[0], flat[1], within], Counter(), {"x"}) == []
    host = [flat[0], flat[1], _reading("end", 1000, rss=3 << 30)]
    assert any("resident memory grew 3.000 GiB" in p for p in verdict(host, Counter(), {"x"}))
    kept = [flat[0], flat[1], _reading("end", 1000, saved=300)]
    assert any("after it was emptied" in p for p in verdict(kept, Counter(), {"x"}))
    assert any("changed" in p for p in verdict(flat, Counter(), {"a", "b"}))
    errors = Counter({"HTTP 500 server_error": 2})
    assert verdict(flat, errors, {"x"}) == ["2 unexpected: HTTP 500 server_error"]
