"""A decode step's DeltaNet layer through out_proj in one launch (gdn_step_out.cu).

Where the DeltaNet step runs over a thread block cluster (`deltanet.split_shape`), out_proj is
MLX 4-bit with groups of 64 and each block's value columns are 32 or 64 (every Qwen3.5 size),
the step's launch also applies the gated output norm and out_proj: each block multiplies its
own columns of out_proj (copied to shared memory before the wait for the previous kernel),
the cluster sums its blocks' products through distributed shared memory, and the last
cluster to finish a slice of the output sums the key heads' slices in a fixed order. A
DeltaNet layer of a step is then four launches, not five. The tickets that find the last
cluster are a small zeroed buffer of this object's (each launch leaves them at zero).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.deltanet import STEP_MAX_TAPS, split_shape
from engine.backends.cuda.launch import Kernels, ahead_spans, smem_per_block
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.weights import QWeight

i32, f32 = np.int32, np.float32

FILE = "gdn_step_out.cu"
STATIC_SMEM = 4096  # the kernel's static shared memory rounded up (q, k, v, y, reductions)
COLUMN_WIDTHS = (32, 64)  # value columns a block (CB): the instances the kernel has


def out_kernel(
    Hk: int,
    Hv: int,
    dk: int,
    dv: int,
    K: int,
    blocks: int,
    capability: int,
    hidden: int,
    dtype: str,
) -> tuple[str, int, int] | None:
    """(instance, threads, columns a block) of the fused step for these sizes, or None where
    it does not apply (then gdn_step_split and out_proj's own gemv4 launch)."""
    if dtype == "float32" or K > STEP_MAX_TAPS or not blocks:
        return None
    split = split_shape(Hk, Hv, dk, dv, blocks, capability)
    if split is None:
        return None
    cb = Hv // Hk * dv // blocks
    if cb not in COLUMN_WIDTHS or hidden % (8 * blocks):
        return None
    nc, threads = split
    return f"gdn_step_out<{nc},{blocks},{cb}>", threads, cb


def out_smem(hidden: int, cb: int, itemsize: int) -> int:
    """Dynamic shared memory of a launch: the block's codes, scales and biases, its products."""
    return hidden * cb // 2 + 2 * hidden * itemsize + 4 * hidden


class StepOut:
    """Owns gdn_step_out.cu and its tickets; carves each launch's partial sums from `frame`."""

    def __init__(self, kernels: Kernels, frame: Any, tuning: Tuning) -> None:
        self.k, self.frame, self.tuning = kernels, frame, tuning
        self.tickets: Any = None  # uint32 [slots * blocks]: zero between launches

    def alloc(self, slots: int) -> None:
        """The tickets for steps of up to `slots` streams."""
        import cupy

        self.tickets = cupy.zeros(
            max(1, slots) * max(1, self.tuning.deltanet_step_blocks), np.uint32
        )

    @property
    def nbytes(self) -> int:
        return 0 if self.tickets is None else self.tickets.nbytes

    def kernel(self, config: Any, z: Any, out_proj: Any, capability: int) -> tuple | None:
        """(instance, threads, columns a block, dynamic shared memory) where this step's
        DeltaNet can run out_proj in its launch, else None."""
        c = config
        if not self.tuning.fused_out_proj or self.tickets is None:
            return None
        w = out_proj
        if not (isinstance(w, QWeight) and w.blocked and w.bits == 4 and w.group_size == 64):
            return None
        hidden, VD = w.shape
        if VD != c.value_dim or z.strides[1] != z.itemsize or z.data.ptr % 16:
            return None
        dims = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim)
        dims += (c.linear_value_head_dim, c.linear_conv_kernel_dim)
        P = self.tuning.deltanet_step_blocks
        found = out_kernel(*dims, P, capability, hidden, self.k.dtype)
        if found is None:
            return None
        sym, threads, cb = found
        smem = out_smem(hidden, cb, self.k.act_itemsize)
        if smem + STATIC_SMEM > smem_per_block():
            return None
        return sym, threads, cb, smem

    def run(
        self,
        kernel: tuple,
        step_args: tuple,
        segs: tuple,
        n_segs: int,
        z: Any,
        norm: Any,
        eps: float,
        out_proj: QWeight,
        config: Any,
        ahead: tuple,
    ) -> Any:
        """The launch: `step_args` as gdn_step_split takes them up to the state; returns the
        layer's output [R, hidden] (out_proj of the gated norm of the delta rule's output)."""
        import cupy

        sym, threads, _, smem = kernel
        c, fr = config, self.frame
        Hk, P = c.linear_num_key_heads, self.tuning.deltanet_step_blocks
        hidden = out_proj.shape[0]
        part = fr.take((n_segs, Hk, hidden), cupy.float32)
        out = fr.take((z.shape[0], hidden))
        fn = self.k.fn(FILE, sym)
        self.k.allow_smem(fn, (FILE, sym), smem)
        dims = (i32(Hk), i32(c.linear_num_value_heads), i32(c.linear_value_head_dim))
        dims += (i32(c.linear_conv_kernel_dim),)
        weights = (out_proj.packed, out_proj.scales, out_proj.biases, i32(hidden))
        spans = ahead_spans((None, *ahead) if self.k.prefetch else (), self.tuning)[2:]
        args = step_args + segs + dims + (z, i32(z.strides[0] // z.itemsize), norm, f32(eps))
        args += weights + (part, self.tickets, out, i32(out.strides[0] // out.itemsize)) + spans
        self.k.launch(fn, (Hk * P, n_segs), (threads,), args, smem)
        return out
