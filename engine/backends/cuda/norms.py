"""Norms, the embedding gather and type conversions (norm.cu, and quant.cu's gathers and
conversions): RMSNorm with and without the residual add, SwiGLU's product, embedding rows of
a dense or quantized table, row gathers, and the conversions between the activation type and
float32 / the checkpoint's types."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.frame import Frame
from engine.backends.cuda.launch import Kernels, cdiv, grid_cap
from engine.backends.cuda.weights import DWeight, QWeight

i32, f32 = np.int32, np.float32


def embed_symbol(bits: int, blocked: bool) -> str:
    """quant.cu's gather of quantized embedding rows (8-row blocks or MLX's row order)."""
    return f"embed_q<{bits},{int(blocked)}>"


class Norms:
    """Owns norm.cu and quant.cu's gathers and conversions. `frame` (None for the
    conversions alone, as the weight upload uses them) is where the ops carve outputs."""

    def __init__(self, kernels: Kernels, frame: Frame | None = None) -> None:
        self.k, self.frame = kernels, frame

    # ----- conversions ----------------------------------------------------------------------
    def convert(self, kind: str, src: Any, dst: Any) -> None:
        """`dst = src` in another type: kind from_bf16, from_f16, from_f32 (into the
        activation type) or to_f32."""
        n = src.size
        grid = (min(cdiv(n, 256), grid_cap()),)
        self.k.run("quant.cu", kind, grid, (256,), (src, dst, np.int64(n)))

    def to_f32(self, x: Any, out: Any) -> None:
        self.convert("to_f32", x, out)

    # ----- gathers ----------------------------------------------------------------------------
    def embed_into(self, table: Any, ids: Any, out: Any) -> None:
        """out[r] = table[ids[r]], dequantized where the table is quantized."""
        R, cols = out.shape
        if isinstance(table, QWeight):
            self.k.run(
                "quant.cu",
                embed_symbol(table.bits, table.blocked),
                (R,),
                (256,),
                (
                    table.packed,
                    table.scales,
                    table.biases,
                    ids,
                    out,
                    i32(cols),
                    i32(table.group_size),
                ),
            )
        else:
            data = table.data if isinstance(table, DWeight) else table
            self.k.run("quant.cu", "embed_dense", (R,), (256,), (data, ids, out, i32(cols)))

    def gather_rows(self, x: Any, rows: Any, out: Any) -> None:
        self.k.run(
            "quant.cu", "gather_rows", (out.shape[0],), (256,), (x, rows, out, i32(x.shape[1]))
        )

    def take_rows(self, x: Any, rows: np.ndarray) -> Any:
        """`x[rows]` (rows on the host); x itself where rows are all of it, in order."""
        import cupy

        rows = np.asarray(rows, np.int32)
        if len(rows) == x.shape[0] and np.array_equal(rows, np.arange(len(rows))):
            return x
        out = self.frame.take((len(rows), x.shape[1]))
        self.gather_rows(x, cupy.asarray(rows), out)
        return out

    # ----- norms and elementwise ------------------------------------------------------------
    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        R, n = x.shape
        out = self.frame.take(x.shape)
        self.k.run(
            "norm.cu",
            "rms_norm",
            (R,),
            (min(1024, cdiv(n, 32) * 32),),
            (x, w, out, i32(n), f32(eps)),
        )
        return out

    def add_rms_norm(self, x: Any, d: Any, w: Any, eps: float) -> tuple[Any, Any]:
        """`h = x + d`; returns `(rms_norm(h) * w, h)`."""
        R, n = x.shape
        out, h = self.frame.take(x.shape), self.frame.take(x.shape)
        self.k.run(
            "norm.cu",
            "add_rms_norm",
            (R,),
            (min(1024, cdiv(n, 32) * 32),),
            (x, d, w, out, h, i32(n), f32(eps)),
        )
        return out, h

    def swiglu(self, g: Any, u: Any, out: Any) -> None:
        """out = silu(g) * u."""
        n = g.size
        grid = (min(cdiv(n, 256), grid_cap()),)
        self.k.run("norm.cu", "swiglu", grid, (256,), (g, u, out, np.int64(n)))
