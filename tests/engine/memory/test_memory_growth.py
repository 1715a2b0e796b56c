"""Pools, the scratch and workspace: growth, failure keeps the old block, measure is pure."""

from __future__ import annotations

import pytest

from engine.config import GIB
from engine.errors import DeviceOutOfMemory, ScratchGrowFailed, WorkspaceGrowFailed
from engine.memory import Scratch, SimulatedPool, Workspace, scratch_layout
from engine.memory.growth import growth_peak, next_capacity
from engine.memory.scratch import ALIGN
from engine.memory.shapes import shape_config

CONFIG = shape_config("0.8B", "mlx4")


def test_pool_budget_limit_and_tags():
    pool = SimulatedPool(1000, other_used=100, limit=600)
    a = pool.alloc(300, "stream:0")
    pool.alloc(200, "stream:1")
    assert pool.held_by_tag() == {"stream:0": 300, "stream:1": 200}
    assert pool.held_by_category() == {"stream": 500}
    assert pool.card_free() == 400
    with pytest.raises(DeviceOutOfMemory) as info:
        pool.alloc(101, "prompt_cache:0")  # the limit binds before the card does
    assert info.value.nbytes == 101 and info.value.category == "prompt_cache"
    a.free()
    a.free()
    assert pool.held_bytes == 200
    with pytest.raises(DeviceOutOfMemory):
        SimulatedPool(1000).alloc(1001, "arena")


def test_pool_injection_by_sequence_tag_and_callable():
    pool = SimulatedPool(10**9, fail_at={1, "scratch"})
    pool.alloc(1, "arena")
    with pytest.raises(DeviceOutOfMemory):
        pool.alloc(1, "arena")  # sequence number 1
    with pytest.raises(DeviceOutOfMemory):
        pool.alloc(1, "scratch")
    pool.fail_at = lambda seq, tag, n: n > 10
    pool.alloc(10, "x")
    with pytest.raises(DeviceOutOfMemory):
        pool.alloc(11, "x")


def test_layout_is_aligned_complete_and_sized():
    layout = scratch_layout(CONFIG, 100, 2, step_rows=4, context=8192)
    names = {b.name for b in layout.buffers}
    for region in ("r0", "r1"):
        for want in ("u", "x", "mixer_out", "act", "gate", "up", "mlp_out"):
            assert f"{region}.{want}" in names
    assert {"head.x", "head.delta", "head.u", "head.h", "head.logits"} <= names
    assert all(b.offset % ALIGN == 0 for b in layout.buffers)
    ends = [b.offset + b.nbytes for b in layout.buffers]
    assert all(e <= b.offset for e, b in zip(ends, layout.buffers[1:], strict=False))
    assert layout.total_bytes >= ends[-1] and layout.total_bytes % ALIGN == 0
    assert layout.get("head.logits").shape == (4, CONFIG.vocab_size)
    (r0, n0), (r1, n1), (h, _) = (layout.regions[r] for r in ("r0", "r1", "head"))
    assert r0 == 0 and r1 == n0 == n1 and h == r0 + n0 + n1  # two equal layer regions


def test_layout_sizes_the_larger_of_window_and_step():
    """Few rows at a long context: the decode partials (step) outweigh the window."""
    long_ctx = scratch_layout(CONFIG, 4, 2, step_rows=4, context=65536)
    assert "r0.split_acc" in {b.name for b in long_ctx.buffers}
    wide = scratch_layout(CONFIG, 512, 2, step_rows=1, context=4096)
    assert "r0.mixed" in {b.name for b in wide.buffers}  # DeltaNet is the wider mixer here


def test_ladder_and_peak():
    assert next_capacity(0, 1, 512) == 16
    assert next_capacity(16, 17, 512) == 32
    assert next_capacity(32, 300, 512) == 512
    assert next_capacity(256, 257, 768) == 512
    assert next_capacity(512, 513, 768) == 768

    def size(r):
        return 10 * r + (5 if r else 0)

    assert growth_peak(size, 0, 512) == size(256) + size(512)
    assert growth_peak(size, 512, 512) == size(512)
    assert growth_peak(size, 0, 768) == size(512) + size(768)


def test_scratch_grows_geometrically_to_max_rows():
    pool = SimulatedPool(8 * GIB)
    scratch = Scratch(pool, CONFIG, 2, max_rows=512)
    assert scratch.capacity_rows == 0 and scratch.nbytes == 0
    seen_peak = 0
    for rows in (1, 2, 17, 100, 300, 512):
        before = pool.held_bytes
        if scratch.ensure(rows):
            seen_peak = max(seen_peak, before + scratch.nbytes)  # old and new held together
        assert scratch.capacity_rows >= rows
        assert pool.held_by_tag() == {"scratch": scratch.nbytes}
    assert scratch.capacity_rows == 512
    assert seen_peak <= Scratch(SimulatedPool(1), CONFIG, 2, 512).growth_peak_bytes()
    assert scratch.growth_peak_bytes() == scratch.nbytes  # nothing left to grow
    assert scratch.pending_bytes() == 0


def test_failed_grow_keeps_old_block_views_and_other_allocations():
    pool = SimulatedPool(8 * GIB)
    stream = pool.alloc(1000, "stream:0")
    scratch = Scratch(pool, CONFIG, 2, max_rows=512)
    scratch.ensure(64)
    block, views, layout = scratch.block, scratch.carve(), scratch.layout
    snapshot = dict(views)
    pool.fail_at = {"scratch"}
    with pytest.raises(ScratchGrowFailed) as info:
        scratch.ensure(200)
    err = info.value
    assert err.rows == 200 and err.capacity_kept == 64 and err.nbytes > 0
    assert "max rows" in str(err) and "memory limit" in str(err)
    assert scratch.capacity_rows == 64 and scratch.block is block and not block.freed
    assert scratch.carve() is views and views == snapshot and scratch.layout is layout
    assert pool.held_by_tag() == {"stream:0": 1000, "scratch": block.nbytes}
    assert not stream.freed
    pool.fail_at = None
    scratch.ensure(200)  # the next request can still grow
    assert scratch.capacity_rows == 256 and block.freed


def test_measure_never_changes_carved_views():
    pool = SimulatedPool(8 * GIB)
    scratch = Scratch(pool, CONFIG, 2, max_rows=512)
    scratch.ensure(32)
    views, snapshot = scratch.carve(), dict(scratch.carve())
    events = list(pool.events)
    for rows in (1, 32, 33, 512):
        scratch.measure(rows)
        scratch_layout(CONFIG, rows, 2)
        scratch.growth_peak_bytes()
    assert scratch.carve() is views and views == snapshot
    assert pool.events == events and scratch.capacity_rows == 32


def test_before_free_runs_before_old_block_is_freed():
    pool = SimulatedPool(8 * GIB)
    scratch = Scratch(pool, CONFIG, 2, max_rows=512)
    order: list[str] = []
    scratch.on_before_free(lambda: order.append("destroy graphs"))
    scratch.on_after_grow(lambda rows: order.append(f"capture {rows}"))
    scratch.ensure(16)
    first = scratch.block
    pool.events.clear()
    order.clear()
    original_free = first.free

    def tracked_free():
        order.append("free old")
        original_free()

    first.free = tracked_free
    scratch.ensure(40)
    assert order == ["destroy graphs", "free old", "capture 64"]
    kinds = [e[0] for e in pool.events]
    assert kinds == ["alloc", "free"]  # the replacement exists before the old block goes


def test_rows_past_max_rows_are_a_caller_error():
    scratch = Scratch(SimulatedPool(GIB), CONFIG, 2, max_rows=128)
    with pytest.raises(ValueError, match="max rows"):
        scratch.ensure(129)


def test_workspace_grows_and_failure_keeps_old():
    pool = SimulatedPool(8 * GIB)
    work = Workspace(pool, CONFIG, 2, max_rows=512)
    work.ensure(20)
    block, views = work.block, work.carve()
    assert work.capacity_rows == 32 and views["tile"].shape[0] * 2 == work.nbytes
    pool.fail_at = {"workspace"}
    with pytest.raises(WorkspaceGrowFailed) as info:
        work.ensure(500)
    assert info.value.capacity_kept == 32
    assert work.block is block and work.carve() is views and not block.freed
    # Without quantized weights only prefill attention scores need it: smaller than a tile.
    pool.fail_at = None
    unquantized = Workspace(pool, shape_config("0.8B", "bf16"), 2, max_rows=512)
    assert unquantized.ensure(512) and 0 < unquantized.nbytes < work.nbytes
