"""The lazy path's decode graphs, worked out without a GPU (the real scratch and workspace on
a simulated card, graphs that record their captures): a prompt's chunk that grows the
scratch captures the graphs it tore down again before the chunk runs, and the decode steps
after it replay without capturing. (That warm-up captures them on the lazy scratch too is
checked on the GPU: tests/device/test_lazy_path.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.backends.cuda.backend import CudaBackend
from engine.backends.cuda.frame import Frame
from engine.backends.cuda.graphs import DecodeGraphs, _Captured
from engine.config import GIB
from engine.errors import GraphCaptureFailed, ScratchGrowFailed, WorkspaceGrowFailed
from engine.memory import SimulatedPool
from engine.memory.shapes import shape_config

MAX_ROWS, SLOTS, CONTEXT = 512, 2, 1024


class _Graph:
    def __init__(self, block, log: list) -> None:
        self.block, self.log = block, log

    def launch(self, stream) -> None:
        self.log.append(self.block)


def _lazy_backend(pool: SimulatedPool):
    """A backend as `grow_for` and the graphs see it, warmed up lazily: the scratch holds
    warm-up's 64-row window, and both batch sizes are captured on it."""
    be = SimpleNamespace(graphs=None, state=SimpleNamespace(context=CONTEXT))
    be.stream = SimpleNamespace(use=lambda: None)
    be.write_batch = lambda batch, ids: None
    be.frame = Frame(np.uint16, lambda: be.graphs.teardown() if be.graphs else None)
    be.frame.alloc_blocks(pool, shape_config("0.8B", "mlx4"), 2, MAX_ROWS, SLOTS, CONTEXT, 16)
    graphs = DecodeGraphs(be, model=None)
    captured: list[tuple[int, object]] = []  # (batch size, the scratch block it points into)
    refuse: set[int] = set()  # batch sizes whose next capture finds no memory
    launched: list = []

    def capture(B: int, splits) -> _Captured:
        if B in refuse:
            refuse.discard(B)
            raise GraphCaptureFailed(f"no memory for the graph of {B} streams")
        block = be.frame.mem_scratch.block
        captured.append((B, block))
        return _Captured(_Graph(block, launched), None, None)

    graphs._capture = capture
    CudaBackend.grow_for(be, Batch.window(0, 0, 64))  # warm-up's window
    graphs.warmed = set(range(1, SLOTS + 1))
    for B in range(1, SLOTS + 1):
        graphs.capture(B)
    return be, graphs, captured, refuse, launched


def test_a_grow_at_a_prompt_chunk_captures_the_graphs_again_before_the_chunk_runs():
    pool = SimulatedPool(4 * GIB)
    be, graphs, captured, _, launched = _lazy_backend(pool)
    scratch = be.frame.mem_scratch
    assert scratch.capacity_rows == 64 and len(captured) == SLOTS
    old = scratch.block
    CudaBackend.grow_for(be, Batch.window(0, 0, 300))
    assert scratch.capacity_rows == MAX_ROWS and scratch.block is not old
    # Scratch and workspace each tore the graphs down; each size was captured once again,
    # on the new block, before the chunk's forward.
    assert captured[SLOTS:] == [(B, scratch.block) for B in range(1, SLOTS + 1)]
    assert set(graphs.graphs) == {1, 2} and not graphs.lost
    # Decode steps after the grow: nothing grows, nothing is captured, the graphs replay.
    before = len(captured)
    for n in range(20):
        step = Batch.step([(0, 300 + n), (1, 40 + n)])
        CudaBackend.grow_for(be, step)  # what a step's eager forward would do
        graphs.replay(step, np.zeros(2, np.int32))
        graphs.replay_next(2)
    assert len(captured) == before
    assert graphs.replays == 40 and launched == [scratch.block] * 40


def test_a_refused_grow_keeps_the_graphs_and_captures_nothing():
    pool = SimulatedPool(4 * GIB)
    be, graphs, captured, _, _ = _lazy_backend(pool)
    kept = dict(graphs.graphs)
    pool.fail_at = {"scratch"}
    with pytest.raises(ScratchGrowFailed):
        CudaBackend.grow_for(be, Batch.window(0, 0, 300))
    assert graphs.graphs == kept and len(captured) == SLOTS and not graphs.lost


def test_a_grow_that_fails_part_way_still_leaves_graphs_on_the_new_scratch():
    """The scratch grew (its graphs torn down), then the workspace could not: the request is
    refused, and the graphs are captured again on the scratch that is now live."""
    pool = SimulatedPool(4 * GIB)
    be, graphs, captured, _, _ = _lazy_backend(pool)
    pool.fail_at = {"workspace"}
    with pytest.raises(WorkspaceGrowFailed):
        CudaBackend.grow_for(be, Batch.window(0, 0, 300))
    live = be.frame.mem_scratch.block
    assert captured[SLOTS:] == [(1, live), (2, live)] and set(graphs.graphs) == {1, 2}


def test_a_capture_refused_at_the_grow_is_tried_again_at_the_next_forward():
    pool = SimulatedPool(4 * GIB)
    be, graphs, captured, refuse, _ = _lazy_backend(pool)
    refuse.add(2)
    CudaBackend.grow_for(be, Batch.window(0, 0, 300))  # the chunk still runs
    assert set(graphs.graphs) == {1} and graphs.lost == {2}
    CudaBackend.grow_for(be, Batch.window(0, 300, 100))  # the next chunk: no grow
    assert set(graphs.graphs) == {1, 2} and not graphs.lost
    assert [B for B, _ in captured[SLOTS:]] == [1, 2]
