"""The device side of one forward pass: the batch's row layout and the buffers it carves.

    meta        int32 [8, max_rows]: ids, pos, row_slot, row_tl, row_n, seg_slot, seg_row0,
                seg_rows -- written before each forward (or graph launch) from a pinned copy
    scratch     engine.memory.Scratch, carved by `scratch` (carver.py: regions r0, r1, head)
    workspace   engine.memory.Workspace, carved by `workspace` (prefill's dequantized tiles
                and attention scores)

The blocks belong to engine.memory (sized by the plan, grown replacement first); this only
hands out their views. Whatever a decode graph points into (meta, the scratch) is given up
only after `before_free` (the backend tears its graphs down there: invariant 5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.backends.base import Batch
from engine.backends.cuda.carver import RegionCarver
from engine.model_config import ModelConfig

META_ROWS = 8


class Frame:
    def __init__(self, act_dtype: Any, before_free: Callable[[], None]) -> None:
        self.scratch = RegionCarver("scratch", spill=("head",), dtype=act_dtype)
        self.workspace = RegionCarver("workspace", spill=("ws",), dtype=act_dtype)
        self.mem_scratch: Any = None  # engine.memory.Scratch, made by `alloc_blocks`
        self.mem_workspace: Any = None  # engine.memory.Workspace
        self.meta: Any = None
        # Two pinned host copies of `meta`, used in turn: a forward's layout is written
        # into one while the other may still feed the last forward's queued copy, so a
        # prompt's windows queue one after another without the host waiting for the GPU.
        self.meta_hosts: list[Any] = []
        self._copied: list[Any] = []  # per host copy: an event recorded after its copy
        self._turn = 0
        self.capturing = False  # a decode graph is being captured: nothing is written
        self._before_free = before_free

    @property
    def nbytes(self) -> int:
        """Bytes of `meta` (the blocks are counted by the pool that holds them)."""
        return 0 if self.meta is None else self.meta.nbytes

    def alloc_meta(self, cap: int) -> None:
        """`meta` (and its pinned host copy) for forwards of up to `cap` rows."""
        import cupy

        self._before_free()
        for event in self._copied:
            event.synchronize()  # no queued copy reads the old host buffers
        self.meta = cupy.zeros((META_ROWS, cap), cupy.int32)
        self.meta_hosts = []
        for _ in range(2):
            mem = cupy.cuda.alloc_pinned_memory(META_ROWS * cap * 4)
            host = np.frombuffer(mem, np.int32, META_ROWS * cap).reshape(META_ROWS, cap)
            self.meta_hosts.append(host)
        # Recorded after each copy from their buffer; one not yet recorded counts as done.
        self._copied = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]

    @property
    def meta_host(self) -> Any:
        """The host copy of `meta` the last `write` filled."""
        return self.meta_hosts[self._turn] if self.meta_hosts else None

    def alloc_blocks(
        self,
        pool: Any,
        config: ModelConfig,
        itemsize: int,
        max_rows: int,
        step_rows: int,
        context: int,
        score_rows: int,
        kv_cache: str = "bf16",
    ) -> None:
        """The scratch and workspace for this state (allocated when first ensured; the
        workspace also holds a KV head dequantized where `kv_cache` is "int8"). `step_rows`:
        the most rows of a decode-shaped forward (engine.memory.plan.verify_step_rows)."""
        from engine.memory import Scratch, Workspace

        self.mem_scratch = Scratch(pool, config, itemsize, max_rows, step_rows, context)
        self.mem_workspace = Workspace(
            pool, config, itemsize, max_rows, context, score_rows, kv_cache
        )
        for mem in (self.mem_scratch, self.mem_workspace):
            mem.on_before_free(self._before_free)  # invariant 5: graphs go first
            mem.on_after_grow(self.attach)

    def release_blocks(self) -> None:
        for mem in (self.mem_scratch, self.mem_workspace):
            if mem is not None:
                mem.release()

    def detach(self) -> None:
        self.scratch.detach()
        self.workspace.detach()

    def attach(self, _rows: int = 0) -> None:
        """Point the carvers at the live scratch / workspace blocks (after a grow)."""
        ms, mw = self.mem_scratch, self.mem_workspace
        if ms is not None and ms.block is not None:
            self.scratch.attach(ms.block, ms.layout.regions)
        if mw is not None and mw.block is not None:
            self.workspace.attach(mw.block, {"ws": (0, mw.nbytes)})

    def ensure(self, batch: Batch) -> None:
        """Grow the blocks for `batch` before any kernel of its forward runs: a failed grow
        refuses this request and leaves every stream's state as it was."""
        if self.mem_scratch is not None:
            self.mem_scratch.ensure(min(batch.rows, self.mem_scratch.max_rows))
            if not batch.is_step:
                self.mem_workspace.ensure(min(batch.rows, self.mem_workspace.max_rows))

    def write(self, batch: Batch, ids: np.ndarray, context: int, stream: Any) -> None:
        """Copy token ids and the row/segment layout into `meta` (asynchronously)."""
        R, S = batch.rows, len(batch.segments)
        if R > self.meta.shape[1]:
            self.alloc_meta(R)
        batch.check_context(context)
        self._turn = 1 - self._turn
        self._copied[self._turn].synchronize()  # its copy two forwards ago has run
        h = self.meta_host
        h[0, :R] = ids
        h[1, :R] = batch.positions()
        rows = np.array([s.rows for s in batch.segments], np.int32)
        row0 = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int32)
        h[2, :R] = np.repeat([s.slot for s in batch.segments], rows)
        h[3, :R] = np.arange(R, dtype=np.int32) - np.repeat(row0, rows)
        h[4, :R] = np.repeat(rows, rows)
        h[5, :S] = [s.slot for s in batch.segments]
        h[6, :S] = row0
        h[7, :S] = rows
        self.meta.data.copy_from_host_async(h.ctypes.data, h.nbytes, stream)
        self._copied[self._turn].record(stream)

    @property
    def step_rows(self) -> int:
        """The most rows a decode-shaped forward takes (the scratch's step buffers: the
        streams, or a drafting verify's rows; engine.memory.plan.verify_step_rows)."""
        ms = self.mem_scratch
        return 1 if ms is None or ms.step_rows is None else ms.step_rows

    def rows(self, R: int) -> tuple[Any, Any, Any, Any]:
        """Per row: position, slot, index in its segment, its segment's rows."""
        m = self.meta
        return m[1, :R], m[2, :R], m[3, :R], m[4, :R]

    def segs(self, S: int) -> tuple[Any, Any, Any]:
        """Per segment: slot, first row, rows."""
        m = self.meta
        return m[5, :S], m[6, :S], m[7, :S]

    def take(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        """The next scratch view (activation type unless `dtype`)."""
        return self.scratch.take(shape, dtype)
