"""Projections whose columns are split over blocks (`gemv4_split` in gemv4.cu), summed in
fixed point.

The down projection of a decode step has few output rows (the hidden size) and long ones
(the intermediate size): as one tile per block it gives about one block per SM, each warp
streaming its groups one batch after another. Cut into column slices, it gives several
blocks per SM, each with a shorter stream and a shorter input to stage. The slices' products
are added into an int64 accumulator with 32 fraction bits: integer sums do not depend on the
order the blocks arrive in, so every run gives the same result. The next kernel reads them
as the activations a whole projection would have stored (prologue 3, `add_rms_norm_fix`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.gemv import GEMV4_VARIANTS, Pro, _cdiv
from engine.backends.cuda.weights import QWeight

i32 = np.int32
SPLIT_SLICES = (2, 4, 8)  # column slices a split projection may take


class Fixed:
    """A projection's output held as fixed-point sums (int64 `acc`, 32 fraction bits)."""

    def __init__(self, acc: Any):
        self.acc = acc
        self.shape = acc.shape


def pro_add_norm(norm: Any, eps: float, delta: Any, h: Any) -> Pro:
    """The residual add and norm before a projection, for a delta of either kind."""
    if isinstance(delta, Fixed):
        return Pro(3, norm, eps, delta=delta.acc, h=h)
    return Pro(1, norm, eps, delta=delta, h=h)


class SplitMixin:
    """Split projections for `Ops` (with `GemvMixin`)."""

    # The decode step's down projections split over column slices (`CudaBackend.norm_mlp`).
    split_down = True

    def split_ok(self, x: Any, w: Any) -> bool:
        """Whether `gemv_split` can run `x @ w.T`: gemv4's conditions, and at least two
        column groups (a split needs whole groups in each slice)."""
        return (
            self.split_down
            and isinstance(w, QWeight)
            and self._gemv4_ok(x, w)
            and x.strides[1] == x.itemsize
            and bool(self.split_candidates(x, w))
        )

    def split_candidates(self, x: Any, w: Any) -> list[tuple]:
        """('split', slices, ks, tpb, ug, pipe) for gemv4's register variants and every slice
        count that cuts the columns into whole groups."""
        ng = w.shape[1] // 64
        return [
            ("split", s, *v[:4])
            for s in SPLIT_SLICES
            if ng % s == 0
            for v in GEMV4_VARIANTS
            if not v[4]
        ]

    def gemv_split(self, x: Any, w: Any, acc: Any, zero: Any) -> None:
        """acc[m] += x[m] @ w.T as fixed point, the columns split over blocks; `zero` (the
        previous layer's accumulator) is cleared in the same launch. Tuned per shape."""
        key = ("split", *self.gemv_key(x, w))
        choice = self.gemv_choice.get(key)
        if choice is None:
            import cupy

            def timer(c: tuple) -> float:  # into buffers of its own
                own_acc, own_zero = cupy.zeros_like(acc), cupy.zeros_like(zero)
                return self.time_launches(lambda: self._split_launch(c, x, w, own_acc, own_zero))

            choice = self.rank(key, self.split_candidates(x, w), timer)
        if self.graphing:
            self.step_keys.append(key)
        self._split_launch(choice, x, w, acc, zero)

    def _split_launch(self, choice: tuple, x: Any, w: Any, acc: Any, zero: Any) -> None:
        import cupy

        from engine.backends.cuda.modules import ACT_KINDS, _source

        R, cols = x.shape
        _, slices, ks, tpb, ug, pipe = choice
        part = cols // slices
        v = (ks, tpb, ug, pipe, False)
        ks, threads = self._gemv4_shape(part, v)
        sym = self._split_sym(R, (ks, tpb, ug, pipe), threads)
        fn = self._gemv4_mods.get(sym)
        if fn is None:
            mod = self._gemv4_mods.get(("split", R, part))
            if mod is None:  # one module per row count and slice width
                names = []
                for c in GEMV4_VARIANTS:
                    if not c[4]:
                        k, t = self._gemv4_shape(part, c)
                        names.append(self._split_sym(R, (k, *c[1:4]), t))
                opts = ("-std=c++17", f"-DACT_KIND={ACT_KINDS[self.dtype]}")
                opts += tuple(f"-D{d}" for d in self.gemv4_defines)
                mod = cupy.RawModule(
                    code=_source("gemv4.cu"), options=opts, name_expressions=sorted(set(names))
                )
                self._gemv4_mods[("split", R, part)] = mod
            fn = self._gemv4_mods[sym] = mod.get_function(sym)
        smem = self._gemv4_smem(R, part, threads)
        self.allow_smem(fn, ("split", sym), smem)
        tiles = _cdiv(_cdiv(w.shape[0], 16), tpb)
        per_slice = max(1, self._gemv4_resident(fn, threads, smem) // slices)
        grid = (min(tiles, per_slice), slices)
        ldx = x.strides[0] // x.itemsize
        args = (w.packed, w.scales, w.biases, x, i32(ldx), i32(w.shape[0]), i32(part))
        args += (i32(cols // 8), acc, zero, i32(zero.size))
        self.launch(fn, grid, (threads,), args, smem)

    @staticmethod
    def _split_sym(R: int, v: tuple, threads: int) -> str:
        _, tpb, ug, pipe = v
        return f"gemv4_split<{R},{tpb},{ug},{'true' if pipe else 'false'},{threads}>"
