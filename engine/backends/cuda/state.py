"""Per-stream state of the CUDA backend: KV cache, conv and recurrent state, snapshots.

One pool block holds every stream's state, one slot per stream (no spare slot: warm-up runs
on the slots before any stream is live, and a graph capture executes nothing):

    kv_k, kv_v  [full layers, slots, Hkv, context, hd]   activation type
    conv        [linear layers, slots, K-1, C]           activation type
    recurrent   [linear layers, slots, Hv, dv, dk]       fp32 (value column contiguous)

A saved stream (prompt cache) is a copy of one slot in its own `prompt_cache` block. Host
embeddings (invariant 7) live here too: the rows of a forward's ids, gathered on the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.launch import on_stream
from engine.backends.cuda.sample_ops import draw_buffers
from engine.config import ModelConfig
from engine.memory.arena import ALIGN


class StateMixin:
    """Mixed into CudaBackend; uses its `cp`, `ops`, `pool`, `stream` and `config`."""

    def alloc_state(self, config: ModelConfig, slots: int, context: int) -> None:
        from engine.memory import Scratch, Workspace

        cp, c = self.cp, config
        self.stream.use()
        self._teardown_graphs()
        self.config, self.slots, self.context = c, slots, context
        self.nvalid = self.nvalid or c.vocab_size
        n = slots
        act = self.ops.act_dtype
        shapes = [
            ((len(c.full_layers), n, c.num_key_value_heads, context, c.head_dim), act),
            ((len(c.full_layers), n, c.num_key_value_heads, context, c.head_dim), act),
            ((len(c.linear_layers), n, c.linear_conv_kernel_dim - 1, c.conv_dim), act),
            (
                (
                    len(c.linear_layers),
                    n,
                    c.linear_num_value_heads,
                    c.linear_value_head_dim,
                    c.linear_key_head_dim,
                ),
                cp.float32,
            ),
        ]
        for block in (self._state_block, self.mem_scratch, self.mem_workspace):
            if block is not None:  # a second alloc_state replaces everything sized by it
                block.free() if hasattr(block, "free") else block.release()
        self._state_block, (self.kv_k, self.kv_v, self.conv, self.recurrent) = self._carve_block(
            shapes, "stream"
        )
        for arr in (self.kv_k, self.kv_v, self.conv, self.recurrent):
            arr.fill(0)
        self._alloc_meta(max(self.max_rows, 64))
        self.counter = cp.zeros(max(self.max_rows, 64), cp.uint32)
        self.argmax_work = cp.zeros(2 * max(self.max_rows, 64), cp.uint64)
        self.picks = cp.zeros(max(self.max_rows, 64), cp.int32)
        self.seen = cp.zeros((slots, -(-c.vocab_size // 32)), cp.uint32)
        self.draw_cand = draw_buffers()  # the split draw's candidates
        itemsize = self.ops.act_itemsize
        self.mem_scratch = Scratch(self.pool, c, itemsize, self.max_rows, slots, context)
        self.mem_workspace = Workspace(
            self.pool, c, itemsize, self.max_rows, context, self.score_rows
        )
        for mem in (self.mem_scratch, self.mem_workspace):
            mem.on_before_free(self._teardown_graphs)  # invariant 5: graphs go first
            mem.on_after_grow(self._attach_blocks)

    def _carve_block(self, shapes: list, tag: str) -> tuple[Any, list[Any]]:
        """One pool block holding arrays of `shapes` [(shape, dtype)], each 256-aligned."""
        sizes = [
            -(-int(np.prod(sh)) * self.cp.dtype(dt).itemsize // ALIGN) * ALIGN for sh, dt in shapes
        ]
        block = self.pool.alloc(max(sum(sizes), ALIGN), tag)
        arrays, offset = [], 0
        for (shape, dtype), size in zip(shapes, sizes, strict=True):
            arrays.append(block.view(offset, shape, self.cp.dtype(dtype).name))
            offset += size
        return block, arrays

    def reset_slot(self, slot: int) -> None:
        with on_stream(self.stream):  # ordered with the forwards on the backend's stream
            for arr in (self.kv_k, self.kv_v, self.conv, self.recurrent):
                arr[:, slot] = 0

    def save_slot(self, slot: int, length: int) -> Any:
        """A copy of one stream's state in its own `prompt_cache` pool block (raises
        DeviceOutOfMemory when the card or the limit has no room for it)."""
        parts = {
            "kv_k": self.kv_k[:, slot, :, :length],
            "kv_v": self.kv_v[:, slot, :, :length],
            "conv": self.conv[:, slot],
            "recurrent": self.recurrent[:, slot],
        }
        block, copies = self._carve_block(
            [(a.shape, a.dtype) for a in parts.values()], "prompt_cache"
        )
        with on_stream(self.stream):
            for dst, src in zip(copies, parts.values(), strict=True):
                dst[...] = src
        return {"length": length, "block": block, **dict(zip(parts, copies, strict=True))}

    def snapshot_bytes(self, length: int) -> int:
        """Bytes `save_slot` takes for a stream of `length` tokens."""
        c, isz = self.config, self.ops.act_itemsize
        kv = 2 * len(c.full_layers) * c.num_key_value_heads * length * c.head_dim * isz
        conv = len(c.linear_layers) * (c.linear_conv_kernel_dim - 1) * c.conv_dim * isz
        rec = len(c.linear_layers) * c.linear_num_value_heads * c.linear_key_head_dim
        rec *= c.linear_value_head_dim * 4
        return sum(-(-n // ALIGN) * ALIGN for n in (kv // 2, kv // 2, conv, rec))

    def free_snapshot(self, snapshot: Any) -> None:
        snapshot["block"].free()

    def restore_slot(self, slot: int, snapshot: Any) -> None:
        self.reset_slot(slot)
        n = snapshot["length"]
        with on_stream(self.stream):
            self.kv_k[:, slot, :, :n] = snapshot["kv_k"]
            self.kv_v[:, slot, :, :n] = snapshot["kv_v"]
            self.conv[:, slot] = snapshot["conv"]
            self.recurrent[:, slot] = snapshot["recurrent"]

    def _host_embedding_rows(self, ids: np.ndarray) -> None:
        """Gather the rows of `ids` on the host and queue their copy into `emb_rows`."""
        from engine.bf16 import to_bf16

        t, H = self.host_table, self.config.hidden_size
        R = len(ids)
        if self.emb_rows is None or self.emb_rows.shape[0] < R:
            cap = max(R, self.max_rows)
            self.emb_rows = self.cp.zeros((cap, H), self.ops.act_dtype)
            mem = self.cp.cuda.alloc_pinned_memory(cap * H * self.ops.act_itemsize)
            self.emb_host = np.frombuffer(mem, self.ops.act_dtype, cap * H).reshape(cap, H)
        if hasattr(t, "dequantize"):
            rows = t.dequantize(np.asarray(ids, np.int64))
        else:
            rows = np.asarray(t)[np.asarray(ids, np.int64)]
        if self.dtype == "bfloat16":
            self.emb_host[:R] = to_bf16(rows)
        else:
            self.emb_host[:R] = rows.astype(self.ops.act_dtype)
        nbytes = R * H * self.ops.act_itemsize
        self.emb_rows.data.copy_from_host_async(self.emb_host.ctypes.data, nbytes, self.stream)
