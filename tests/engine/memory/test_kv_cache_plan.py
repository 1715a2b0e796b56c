"""The planner with the 8-bit KV cache: the bytes it counts for the stream state, the
prompt's workspace and the saved states, and what it admits on a 4 GiB card."""

from __future__ import annotations

import json
from dataclasses import replace

from engine.cli_plan import card_table, main
from engine.config import GIB, EngineSettings
from engine.memory import Card, SimulatedPool, admit, decide, stream_state_bytes
from engine.memory.shapes import shape_config, shape_tensor_specs
from engine.memory.workspace import workspace_bytes
from tests.engine.memory.conftest import commit, shape_plan

FOUR_GIB = Card(total=4 * GIB, free=4 * GIB, fused_attention=True)  # as snug plan --card-gib


def test_the_stream_state_counts_a_byte_an_element_and_a_scale_a_row():
    c = shape_config("4B", "mlx4")
    bf16, int8 = (stream_state_bytes(c, 32768, 2, kv) for kv in ("bf16", "int8"))
    rows = 2 * len(c.full_layers) * c.num_key_value_heads * 32768  # K and V rows of a head
    assert bf16.kv == rows * c.head_dim * 2 and int8.kv == rows * (c.head_dim + 4)
    assert (int8.conv, int8.recurrent) == (bf16.conv, bf16.recurrent)
    assert stream_state_bytes(c, 32768, 4, "int8").kv == int8.kv  # fp32 compute: still 8-bit


def test_the_workspace_holds_a_kv_head_dequantized():
    c = shape_config("4B", "mlx4")
    bf16, int8 = (workspace_bytes(c, 512, 2, 65536, 16, kv) for kv in ("bf16", "int8"))
    assert int8 - bf16 == 2 * 65536 * c.head_dim * 2  # one head's keys and values, bf16


def test_the_4b_admits_32k_tokens_on_a_4_gib_card_with_the_8_bit_cache(capsys):
    c = shape_config("4B", "mlx4")
    specs = shape_tensor_specs(c, "mlx4")
    s = EngineSettings()
    at_32k = decide(specs, c, replace(s, kv_cache="int8"), FOUR_GIB, context=32768)
    assert at_32k.fits and at_32k.kv_cache == "int8" and at_32k.max_rows >= 256
    most = {
        kv: decide(specs, c, replace(s, kv_cache=kv), FOUR_GIB, context=None, any_chunks=True)
        for kv in "bf16 int8".split()
    }
    assert most["int8"].context >= 32768 and most["int8"].context > most["bf16"].context * 1.5
    argv = ["plan", "--shape", "4B", "--format", "mlx4", "--card-gib", "4", "--kv-cache", "int8"]
    assert main([*argv, "--context", "32768", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kv_cache"] == "int8" and data["context"] == 32768
    assert main([*argv, "--context", "32768"]) == 0
    assert "8-bit KV cache" in capsys.readouterr().out
    rows = {(r["shape"], r["format"]): r for r in card_table(4 * GIB, 4 * GIB, s)}
    assert rows[("4B", "mlx4")]["largest_context_int8"] == most["int8"].context
    assert rows[("4B", "mlx4")]["largest_context"] == most["bf16"].context


def test_a_context_the_bf16_cache_misses_suggests_the_8_bit_one():
    plan = shape_plan("4B", "mlx4", context=40960, streams=1, max_rows=512)
    d = admit(plan, 4 * GIB, 4 * GIB)
    assert not d.fits and ("kv_cache", "int8") in d.fixes
    assert any(t.startswith("use the 8-bit KV cache") for t in d.suggestions)
    small = plan.with_kv_cache("int8")
    assert small.state.kv < plan.state.kv * 0.52 and small.kv_cache == "int8"
    assert small.resized(context=1024).kv_cache == "int8"  # a resize keeps the cache
    assert not any(f == ("kv_cache", "int8") for f in admit(small, 4 * GIB, 4 * GIB).fixes)


def test_an_8_bit_decision_commits_within_the_card():
    """Allocated as a session does, then every prefill chunk size: the pool never runs out
    (the workspace's dequantized head included)."""
    plan = shape_plan("4B", "mlx4", context=49152, streams=1, max_rows=512)
    plan = plan.with_kv_cache("int8")
    s = EngineSettings()
    d = admit(plan, 4 * GIB, 4 * GIB, settings=s)
    assert d.fits and d.kv_cache == "int8"
    held = commit(plan, d, SimulatedPool(4 * GIB, other_used=s.reserve_bytes))
    for rows in (16, 256, d.max_rows):
        held.scratch.ensure(rows)
        held.workspace.ensure(rows)
    assert held.workspace.nbytes >= 2 * 49152 * plan.config.head_dim * 2


def test_a_card_with_fused_attention_gives_the_workspace_no_scores():
    """Where prefill attention runs fused (16-bit activations, sm_80 and newer) the plan's
    workspace holds no scores, so the same card admits a longer context; fp32 activations
    and cards without it keep room for the scores."""
    c = shape_config("4B", "mlx4")
    specs = shape_tensor_specs(c, "mlx4")
    s = EngineSettings()
    plain = replace(FOUR_GIB, fused_attention=False)
    big = Card(total=24 * GIB, free=24 * GIB, fused_attention=True)  # room for 256-row scores
    fused = decide(specs, c, s, big, context=16384)
    unfused = decide(specs, c, s, replace(big, fused_attention=False), context=16384)
    assert fused.score_rows == 0 and unfused.score_rows == 256
    scores = c.num_attention_heads * 256 * 16384 * (4 + 2)
    assert unfused.breakdown.workspace_peak >= fused.breakdown.workspace_peak + scores // 2
    longest = [decide(specs, c, s, card, context=None).context for card in (FOUR_GIB, plain)]
    assert longest[0] > longest[1]
    fp32 = decide(specs, c, replace(s, compute_dtype="float32"), FOUR_GIB, context=4096)
    assert fp32.score_rows > 0
