"""Decode-step CUDA graphs: one captured graph per batch size, replayed every step.

Capture rules this module relies on (see the backend): every buffer the step touches is
allocated before capture (weights arena, state, `meta`, the scratch block); the forward
carves its buffers from the scratch block with a bump allocator that restarts at offset 0,
so capture and replay see the same addresses; per-step values (ids, positions, slots) live
in `meta` and are written before launch. The graph ends with greedy selection into the ids
row of `meta` and advances every position by one, so `replay_next` decodes the next token
with no host round trip.

`teardown()` drops every graph; the backend calls it before freeing or moving a buffer a
graph points into (scratch growth, meta growth, new state) and graphs are captured again
on next use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.base import Batch


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
        backend.graphs = self

    def teardown(self) -> None:
        self.graphs.clear()

    def capture(self, batch_size: int) -> None:
        """Warm up (compile kernels, size the scratch) on the scratch slot, then capture."""
        be, B = self.be, batch_size
        if B > be.meta.shape[1]:
            be._alloc_meta(B)
        batch = Batch.step([(be.dummy_slot, 0)] * B)
        ids = np.zeros(B, np.int32)
        self.model.forward(batch, ids)  # eager warm-up: compiles every kernel it needs
        be.scratch.reset()  # grows the block to what the step used (tears down graphs)
        be.prepare(batch, ids)
        be.stream.synchronize()
        be.capturing = True
        be.scratch.capturing = True
        stream = be.stream
        try:
            with stream:
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

    def replay_next(self, batch_size: int) -> tuple[Any, Any]:
        """The next step of the same streams, fed by the previous step's greedy tokens.

        The caller keeps positions within the admitted context (no check on this path).
        """
        cap = self.graphs[batch_size]
        cap.graph.launch(self.be.stream)
        return cap.logits, cap.tokens
