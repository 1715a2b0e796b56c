"""Decode-sized products with a dense matrix in the activation type on tensor cores
(kernels/gemv_tc.cu): 1 to 8 rows of x against 16 weight rows a tile, each weight read once
in a 16-byte load whatever the rows. The SIMT kernel (gemv.cu) does one fused multiply-add
per weight and row, so at a drafting verify's 2 to 4 rows its instructions, not the weights'
bytes, set its time. Both are candidates of `Projections.gemv`, which keeps the one its
timing finds faster for each shape and row count; batch-invariant launches keep the SIMT
kernel's sum order (`gemv_plan.reduction_order`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.card import runs_mma
from engine.backends.cuda.gemv_plan import GEMV_MAX_ROWS
from engine.backends.cuda.launch import cdiv

TC_WARPS = (4, 8)  # warps a block (each a contiguous slice of the columns): the variants
TC_STEPS = 4  # 32-column steps whose weights a lane has in flight at once (U)


def tc_applies(rows: int, cols: int, dtype: str, capability: int) -> bool:
    """Whether gemv_tc runs `rows` rows of a dense matrix `cols` wide in activation type
    `dtype` on a card of this compute capability (mma.m16n8k16 on 16-bit types: sm_80)."""
    return (
        1 <= rows <= GEMV_MAX_ROWS
        and cols % 32 == 0
        and dtype in ("bfloat16", "float16")
        and runs_mma(capability)
    )


def tc_symbol(rows: int, swiglu: bool) -> str:
    return f"gemv_tc<{rows},{'true' if swiglu else 'false'},{TC_STEPS}>"


def tc_tiles(n_out: int, swiglu: bool) -> int:
    """Blocks of a launch: one a tile of 16 output rows (SwiGLU: 8 gate over 8 up rows)."""
    return cdiv(n_out, 8 if swiglu else 16)


def tc_launch(kernels: Any, x: Any, w: Any, out: Any, up: Any, warps: int) -> None:
    """out = x @ w.T, or silu(x @ w.T) * (x @ up.T) with `up`; x [R, in] contiguous rows,
    w and up dense weights (`.data` [n_out, in])."""
    R, cols = x.shape
    n_out = w.shape[0]
    swiglu = up is not None
    i32 = np.int32
    second = up.data if swiglu else w.data
    ldx, ldy = x.strides[0] // x.itemsize, out.shape[1]
    args = (w.data, second, x, i32(ldx), out, i32(ldy), i32(n_out), i32(cols))
    fn = kernels.fn("gemv_tc.cu", tc_symbol(R, swiglu))
    kernels.launch(fn, (tc_tiles(n_out, swiglu),), (32 * warps,), args)
