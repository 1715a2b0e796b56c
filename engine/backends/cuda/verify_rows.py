"""What a drafting verify keeps on the GPU, so that a rejected draft rolls back exactly.

The device side of engine/backends/verify_rows.py (read that first). One pool block
(`stream:verify`, planned as the stream state's `verify` bytes) holds, per DeltaNet layer
and slot:

    history  [layers, slots, K-1+k+1, C]        activation type: the conv state a verify
                                                started from, then its rows' conv inputs
    states   [layers, slots, k, Hv, dv, dk]     fp32: the recurrent state after each of its
                                                first k rows

The verify's one-launch kernels (`gdn_step_keep`, `gdn_step_split_keep`) write both;
elsewhere gdn_scan_keep writes the states and `save_history` copies the history.

`rewind(slot, n)` copies back the state after the verify's first n rows: conv =
history[n : n+K-1], recurrent = states[n-1], for every layer at once.
"""

from __future__ import annotations

from typing import Any

from engine.backends.base import Batch
from engine.backends.cuda.launch import on_stream
from engine.model_config import ModelConfig


class DeviceVerifyRows:
    def __init__(self, state: Any) -> None:
        self.state = state  # StreamState: its pool, stream, conv and recurrent arrays
        self.tokens = 0
        self.taps = 0
        self.block: Any = None
        self.history: Any = None
        self.states: Any = None
        self.kept: dict[int, int] = {}  # slot -> rows of its last verify

    def alloc(self, config: ModelConfig, slots: int, tokens: int) -> None:
        """Room for verifies of up to `tokens` + 1 rows on each of `slots` slots (the old
        block, if any, freed first)."""
        import cupy

        self.free()
        c, st = config, self.state
        self.tokens, self.taps = tokens, c.linear_conv_kernel_dim - 1
        L = len(c.linear_layers)
        hist = (L, slots, self.taps + tokens + 1, c.conv_dim)
        Hv, dv, dk = c.linear_num_value_heads, c.linear_value_head_dim, c.linear_key_head_dim
        rec = (L, slots, tokens, Hv, dv, dk)
        shapes = [(hist, st.k.act_dtype), (rec, cupy.float32)]
        self.block, (self.history, self.states) = st.carve_block(shapes, "stream:verify")

    def free(self) -> None:
        if self.block is not None:
            self.block.free()
        self.block, self.history, self.states = None, None, None
        self.kept.clear()

    @property
    def nbytes(self) -> int:
        return 0 if self.block is None else int(self.block.nbytes)

    def record(self, batch: Batch) -> None:
        """A verify of `batch`'s kept segments is about to run: the rows each will have kept
        (the one-launch kernels write the history themselves; `save_history` otherwise)."""
        for seg in batch.segments:
            if seg.keep:
                if seg.rows > self.tokens + 1:
                    raise ValueError(f"a verify of {seg.rows} rows keeps {self.tokens + 1}")
                self.kept[seg.slot] = seg.rows

    def save_history(self, layer: int, conv: Any, mixed: Any, batch: Batch) -> None:
        """Before a verify's conv state moves on (gdn_prep's path): its kept segments' conv
        state and rows' conv inputs (`conv` the layer's [slots, K-1, C], `mixed` the
        forward's [R, C])."""
        self.record(batch)
        row0 = 0
        with on_stream(self.state.stream):
            for seg in batch.segments:
                if seg.keep:
                    hist = self.history[layer, seg.slot]
                    hist[: self.taps] = conv[seg.slot]
                    hist[self.taps : self.taps + seg.rows] = mixed[row0 : row0 + seg.rows]
                row0 += seg.rows

    def rewind(self, slot: int, rows: int) -> None:
        """Every DeltaNet layer of `slot` back to its state after the first `rows` rows of
        its last verify."""
        kept = self.kept.get(slot, 0)
        if not 0 < rows <= kept:
            raise ValueError(f"slot {slot} kept {kept} verify rows; cannot rewind to {rows}")
        if rows == kept:
            return
        st = self.state
        with on_stream(st.stream):
            st.conv[:, slot] = self.history[:, slot, rows : rows + self.taps]
            st.recurrent[:, slot] = self.states[:, slot, rows - 1]
        self.kept[slot] = rows
