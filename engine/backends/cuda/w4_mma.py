"""A prompt window's product with a 4-bit MLX matrix on tensor cores (kernels/w4_mma.cu),
reading the codes: the route that does not dequantize the matrix into the workspace first.

Not yet a route the projections take: `tests/device/test_w4_mma.py` checks it against numpy
and times it beside the dequantize-then-cuBLAS route, per shape, before the projections
choose between the two by their times (as they choose decode kernels).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.card import runs_mma

TILE = 128  # rows of x and of W a block takes (W4_BM, W4_BN)
THREADS = 256


def w4_symbol(blocked: bool) -> str:
    """The kernel instance for a matrix in MLX's row order or in 8-row blocks."""
    return f"w4_mma<{1 if blocked else 0}>"


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
    grid = (-(-N // TILE), -(-M // TILE))
    args = (x, w.packed, w.scales, w.biases, out, np.int32(M), np.int32(N), np.int32(K))
    kernels.run("w4_mma.cu", w4_symbol(w.blocked), grid, (THREADS,), args)
