"""A prompt window's product with a 4-bit MLX matrix on tensor cores (kernels/w4_mma.cu),
reading the codes: the route that does not dequantize the matrix into the workspace first.
`W4Route` chooses, per matrix shape and window rows, between it and the dequantized route
by their times at warm-up (`tests/device/test_w4_mma.py` checks both against numpy).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.card import runs_mma
from engine.errors import ConfigError

TILE = 128  # rows of x and of W a block takes (W4_BM, W4_BN)
THREADS = 256
# One stage of the kernel's pipeline (W4Stage): a group of 64 columns of x's and W's tiles, as
# 16-bit activations and code words, and W's rows' scales and biases.
STAGE_BYTES = TILE * 64 * 2 + TILE * 12 * 4 + 2 * TILE * 2
MAX_STAGES = 4  # three groups in flight hide a load from device memory on the H200


def w4_stages(smem_per_block: int) -> int:
    """Stages of the kernel on a card whose blocks may take `smem_per_block` bytes of shared
    memory: up to MAX_STAGES (92,160 bytes: within the 99 KiB of sm_86 / sm_89 too)."""
    return max(2, min(MAX_STAGES, smem_per_block // STAGE_BYTES))


def w4_symbol(blocked: bool, smem_per_block: int) -> str:
    """The kernel instance for a matrix in MLX's row order or in 8-row blocks, on a card
    whose blocks may take `smem_per_block` bytes of shared memory."""
    return f"w4_mma<{1 if blocked else 0},{w4_stages(smem_per_block)}>"


def w4_applies(bits: int, group: int, cols: int, rows: int, dtype: str, capability: int) -> bool:
    """Whether the kernel covers a `rows` x `cols` matrix of `bits`-bit codes in groups of
    `group` with this activation type on a card of this compute capability."""
    return (
        bits == 4
        and group == 64
        and cols % 64 == 0
        and rows % 8 == 0
        and dtype in ("bfloat16", "float16")
        and runs_mma(capability)
    )


def w4_mma(kernels: Any, x: Any, w: Any, out: Any) -> None:
    """out [M, N] = x [M, K] @ w.T for a QWeight `w` [N, K] (`w4_applies`; a part of a
    stored group starts on a multiple of 8 rows). x and out are contiguous."""
    M, K = x.shape
    N = w.shape[0]
    assert K == w.shape[1] and out.shape == (M, N) and w.row0 % 8 == 0, (x.shape, w.shape)
    from engine.backends.cuda.launch import smem_per_block

    grid = (-(-N // TILE), -(-M // TILE))
    args = (x, w.packed, w.scales, w.biases, out, np.int32(M), np.int32(N), np.int32(K))
    room = smem_per_block()
    sym = w4_symbol(w.blocked, room)
    fn = kernels.fn("w4_mma.cu", sym)
    smem = w4_stages(room) * STAGE_BYTES
    kernels.allow_smem(fn, ("w4_mma", sym), smem)
    kernels.launch(fn, grid, (THREADS,), args, smem)


ENV_W4 = "SNUG_W4_MMA"  # auto (default: by the times at warm-up), on, off


class W4Route:
    """Which route each 4-bit matrix's prompt-sized products take: `w4_mma`, or the matrix
    dequantized into the workspace and multiplied by cuBLAS. With SNUG_W4_MMA=auto (the
    default) warm-up's first window times both routes for each matrix shape at two row
    counts (`timing`), fits each a fixed cost plus a cost per row, and a product of R rows
    takes the route predicted faster at R; a shape warm-up did not time takes cuBLAS. `on`
    and `off` force the route (benchmarks compare them)."""

    def __init__(self, kernels: Any, mode: str | None = None) -> None:
        import os

        self.k = kernels
        self.mode = (mode or os.environ.get(ENV_W4, "auto")).strip().lower()
        if self.mode not in ("auto", "on", "off"):
            raise ConfigError(f"{ENV_W4}={self.mode!r} is not a choice: set it to auto, on or off")
        self.fits: dict[tuple, tuple[float, float, float, float]] = {}  # shape -> costs
        self.timing = False  # warm-up's first window: time what is not timed yet

    def applies(self, x: Any, w: Any, out: Any) -> bool:
        from engine.backends.cuda.launch import compute_capability

        bits, group = getattr(w, "bits", 0), getattr(w, "group_size", 0)
        cc = compute_capability()
        return (
            w4_applies(bits, group, w.shape[1], w.shape[0], self.k.dtype, cc)
            and w.row0 % 8 == 0
            and x.flags.c_contiguous
            and out.flags.c_contiguous
            and x.data.ptr % 16 == 0
        )

    def wants(self, x: Any, w: Any, out: Any, dequantized: Any) -> bool:
        """Whether `out = x @ w.T` goes to w4_mma (`dequantized(x, out)`: the other route,
        run here to time it)."""
        if self.mode == "off" or not self.applies(x, w, out):
            return False
        if self.mode == "on":
            return True
        key = (w.shape, w.blocked)
        fit = self.fits.get(key)
        if fit is None and self.timing and x.shape[0] >= 32:
            fit = self.fits[key] = self._time(x, w, out, dequantized)
        if fit is None:
            return False
        fw, sw, fd, sd = fit
        R = x.shape[0]
        return fw + sw * R < fd + sd * R

    def _time(self, x, w, out, dequantized) -> tuple[float, float, float, float]:
        """(fixed, per row) seconds of w4_mma, then of the dequantized route, from their
        best of three at R and R / 8 rows."""
        import cupy

        stream = cupy.cuda.get_current_stream()
        R = x.shape[0]
        sizes = (max(R // 8, 8), R)

        def best(run, rows):
            times = []
            for _ in range(4):
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                e0.record(stream)
                run(x[:rows], out[:rows])
                e1.record(stream)
                e1.synchronize()
                times.append(cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
            return min(times[1:])

        costs = []
        for run in (lambda a, o: w4_mma(self.k, a, w, o), dequantized):
            t1, t2 = (best(run, rows) for rows in sizes)
            per_row = max(t2 - t1, 0.0) / (sizes[1] - sizes[0])
            costs += [max(t1 - per_row * sizes[0], 0.0), per_row]
        return tuple(costs)
