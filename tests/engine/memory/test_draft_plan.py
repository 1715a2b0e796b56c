"""Drafting in the plan: the MTP head's weights and KV cache and a verify's kept rows are
counted where the checkpoint can draft; an MLX checkpoint (no mtp.*) plans as before and
its decision says why it cannot draft."""

from __future__ import annotations

from dataclasses import replace

from engine.checkpoint.names import expected_mtp_tensors
from engine.config import GIB, EngineSettings
from engine.memory import Card, arena_bytes, decide
from engine.memory.plan import kv_row_bytes
from engine.memory.shapes import shape_config, shape_tensor_specs

CARD = Card(total=24 * GIB, free=22 * GIB)
OFF = EngineSettings()


def plan(fmt: str, draft: str):
    config = shape_config("4B", fmt)
    specs = shape_tensor_specs(config, fmt)
    decision = decide(
        specs, config, replace(OFF, draft_tokens=draft), CARD, context=8192, max_rows=256
    )
    return config, specs, decision


def test_drafting_counts_the_head_its_kv_and_the_verify_rows():
    config, specs, off = plan("bf16", "off")
    _, _, on = plan("bf16", "2")
    assert off.draft_tokens == 0 and "drafting is off" in off.drafting
    assert on.draft_tokens == 2 and on.drafting == "drafts 2 tokens a step with the MTP head"
    head = arena_bytes({n: specs[n] for n in expected_mtp_tensors(config)}, 2, mtp=True)
    assert len(head) == 15
    assert on.breakdown.weights - off.breakdown.weights == sum(head.values())
    c, T = config, 8192
    n_lin = len(c.linear_layers)
    kv = 2 * c.num_key_value_heads * kv_row_bytes(c.head_dim, "bf16", 2) * T
    rec = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    history = c.conv_dim * (c.linear_conv_kernel_dim + 2) * 2
    extra = kv + n_lin * (2 * rec + history)
    assert on.breakdown.stream_state_each - off.breakdown.stream_state_each == extra
    # A saved prompt state holds the head's KV, not the verify's rows.
    assert on.breakdown.prompt_cache - off.breakdown.prompt_cache == kv
    assert "\nDrafts 2 tokens a step with the MTP head" in on.format_table()


def test_auto_plans_the_most_drafts():
    _, _, auto = plan("bf16", "auto")
    _, _, three = plan("bf16", "3")
    assert auto.draft_tokens == 3 and "auto" in auto.drafting
    assert auto.breakdown.stream_state_each == three.breakdown.stream_state_each


def test_mlx_checkpoints_plan_without_the_head_and_say_why():
    _, _, off = plan("mlx4", "off")
    _, _, asked = plan("mlx4", "2")
    assert asked.draft_tokens == 0 and "MLX conversions drop them" in asked.drafting
    assert asked.breakdown == off.breakdown
    assert asked.to_dict()["drafting"].startswith("drafting is unavailable")


def test_the_scratch_holds_a_verify_as_a_step_of_its_rows():
    """A verify of k + 1 rows runs its attention row by row and takes every row's logits,
    as a decode step of k + 1 streams does: the scratch is planned for that many."""
    from engine.memory.plan import verify_step_rows
    from engine.memory.scratch import scratch_bytes

    config, _, off = plan("bf16", "off")
    _, _, on = plan("bf16", "3")
    assert verify_step_rows(1, 0) == 1 and verify_step_rows(1, 3) == 4
    assert verify_step_rows(6, 2) == 6
    one, four = (scratch_bytes(config, 256, 2, rows, 8192) for rows in (1, 4))
    assert four > one
    assert off.breakdown.scratch_peak == one and on.breakdown.scratch_peak == four
    # The CUDA attention takes a batch row by row where the step buffers hold its rows.
    from engine.backends.base import Batch

    assert Batch.verify(0, 50, 4).per_row(4) and not Batch.verify(0, 50, 4).per_row(1)
    assert Batch.step([(0, 9), (1, 3), (2, 7)]).per_row(1)
    assert not Batch.window(0, 0, 512).per_row(4)
