"""Decode-step CUDA graphs: one captured graph per batch size, replayed every step.

Capture rules this module relies on (see the backend): every buffer the step touches is
allocated before capture (weights arena, state, `meta`, the scratch block); the forward
carves its buffers from the scratch block with a bump allocator that restarts at offset 0,
so capture and replay see the same addresses; per-step values (ids, positions, slots) live
in `meta` and are written before launch. The graph ends with greedy selection into the ids
row of `meta` and advances every position by one, so `replay_next` decodes the next token
with no host round trip.

`launch()` runs a step without waiting for it: the picked tokens (greedy, or drawn on the
device) are copied to pinned host memory as the GPU gets to them, and the next step can be
launched, fed by those picks on the device, before the host reads them (`Pending.tokens`).

`teardown()` drops every graph; the backend calls it before freeing or moving a buffer a
graph points into (scratch growth, meta growth, new state) and graphs are captured again
on next use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.base import Batch
from engine.backends.cuda.launch import on_stream


class Pending:
    """A launched decode step's picks, on their way to host memory."""

    def __init__(self, event: Any, host: np.ndarray):
        self.event, self.host = event, host

    def tokens(self) -> list[int]:
        """Wait for the copy; each row's picked token."""
        self.event.synchronize()
        return [int(t) for t in self.host]


@dataclass
class _Captured:
    graph: Any
    logits: Any  # [B, V] view into scratch
    tokens: Any  # [B] int32 view into meta (the next step's input ids)


class DecodeGraphs:
    """Owns the decode graphs of one (backend, model) pair."""

    def __init__(self, backend: Any, model: Any):
        self.be = backend
        self.model = model
        self.graphs: dict[int, _Captured] = {}
        self.warmed: set[int] = set()  # batch sizes whose kernels are compiled and tuned
        self._pinned: list[np.ndarray] = []  # host rings for `launch`, one slot per step
        self._launched = 0
        backend.graphs = self

    def teardown(self) -> None:
        self.graphs.clear()

    def warm(self, batch_size: int) -> None:
        """Run one eager step of `batch_size` rows on slots 0.. (compiles every kernel and
        tunes the projections for this size, which must not happen inside a capture), then
        zero those slots. Only for slots that hold no live stream: at load, or in tests."""
        be, B = self.be, batch_size
        if B > be.meta.shape[1]:
            be._alloc_meta(B)
        self.model.forward(Batch.step([(s, 0) for s in range(B)]), np.zeros(B, np.int32))
        for slot in range(B):
            be.reset_slot(slot)
        self.warmed.add(B)

    def capture(self, batch_size: int) -> None:
        """Capture the decode step of `batch_size` rows. Capturing executes nothing, so the
        slots named in the captured batch are placeholders; replay writes the real ones."""
        be, B = self.be, batch_size
        if B not in self.warmed:
            self.warm(B)
        batch = Batch.step([(s, 0) for s in range(B)])
        ids = np.zeros(B, np.int32)
        be.scratch.reset()
        be.prepare(batch, ids)  # sizes the scratch for B rows before capture
        be.stream.synchronize()
        be.capturing = True
        be.scratch.capturing = True
        be.ops.graphing = True
        stream = be.stream
        try:
            with on_stream(stream):
                stream.begin_capture()
                try:
                    logits = self.model.forward(batch, ids)
                    tokens = be.meta[0, :B]
                    be.sample_greedy(logits, out=tokens)
                    be.ops.advance(be.meta[1], B)
                finally:
                    graph = stream.end_capture()
        finally:
            be.capturing = False
            be.scratch.capturing = False
            be.ops.graphing = False
        graph.upload(stream)
        self.graphs[B] = _Captured(graph, logits, tokens)

    def replay(self, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """Run one decode step for `batch` (one row per stream); return (logits, tokens)."""
        assert batch.is_step
        B = batch.rows
        if B not in self.graphs:
            self.capture(B)
        be = self.be
        be.stream.use()
        be.write_batch(batch, np.asarray(ids, np.int32))
        cap = self.graphs[B]
        cap.graph.launch(be.stream)
        return cap.logits, cap.tokens

    def launch(self, batch: Batch | None, ids: Any, rows: list) -> Pending:
        """Run one decode step without waiting for it. `batch` and `ids` as in `replay`, or
        None: the step after the last one launched for the same streams, fed by its picks on
        the device. rows[i] is None (the step's greedy token) or an `engine.sampling.Draw`
        (`CudaBackend.sample_rows`); a drawn pick replaces the greedy one as the next step's
        input."""
        import cupy

        be = self.be
        B = len(rows)
        if batch is None:
            be.stream.use()
            logits, picks = self.replay_next(B)
        else:
            logits, picks = self.replay(batch, ids)
        if any(r is not None for r in rows):
            drawn = be.sample_rows(logits, picks, rows)
            picks[...] = drawn  # what the next step reads as its input ids
        if not self._pinned or len(self._pinned[0]) < B:  # four slots: two steps in flight
            mem = cupy.cuda.alloc_pinned_memory(4 * 4 * B)
            self._pinned = list(np.frombuffer(mem, np.int32, 4 * B).reshape(4, B))
        host = self._pinned[self._launched % 4][:B]
        self._launched += 1
        picks.get(stream=be.stream, out=host, blocking=False)
        event = cupy.cuda.Event()
        event.record(be.stream)
        return Pending(event, host)

    def replay_next(self, batch_size: int) -> tuple[Any, Any]:
        """The next step of the same streams, fed by the previous step's greedy tokens.

        The caller keeps positions within the admitted context (no check on this path).
        """
        cap = self.graphs[batch_size]
        cap.graph.launch(self.be.stream)
        return cap.logits, cap.tokens
