"""Projections: `x @ W.T` for every weight the forward multiplies.

Decode-sized inputs (1 to 8 rows) run a GEMV kernel: `gemv4.cu` (tensor cores, MLX 4-bit
g64 weights in 8-row blocks, half activations) or the SIMT `gemv.cu` (any bits in row order,
dense weights, fp32), each in the variant chosen for its shape (projection_tuning.py).
`gemv4` can also compute its own input from the previous kernel's outputs (a `Prologue`):
the residual add and RMSNorm before every projection, or the DeltaNet's gated per-head norm
before out_proj. Each block recomputes the norm of the (one to eight) input rows it stages,
which is cheap next to the weights it streams, and saves a kernel boundary per norm.

Larger inputs go to cuBLAS (blas.py), a quantized weight first dequantized into the
workspace (quant.cu). quant.cu also rearranges 4-bit matrices into gemv4's 8-row blocks at
load (`to_blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.backends.cuda import blas
from engine.backends.cuda.card import runs_mma
from engine.backends.cuda.frame import Frame
from engine.backends.cuda.gemv_plan import (  # the variants: tools and tests read them here
    GEMV4_VARIANTS,  # noqa: F401
    GEMV_MAX_ROWS,
    GEMV_SWIGLU_VARIANTS,  # noqa: F401
    GEMV_VARIANTS,  # noqa: F401
    TO_BLOCKS,
    Prologue,
    blocked_layout,
    dequant_symbol,
    gemv4_blocks,
    gemv4_kind,
    gemv4_module,
    gemv4_smem,
    gemv4_symbol,
    gemv4_threads,
    gemv4_variants,
    gemv_fits,
    invariant_rows,
    order_candidates,
    prologue_fits,
    reduction_order,
    simt_symbol,
    simt_variants,
)
from engine.backends.cuda.gemv_tc import TC_WARPS, tc_applies, tc_launch
from engine.backends.cuda.launch import (
    Kernels,
    cdiv,
    compute_capability,
    grid_cap,
    or_null,
    sm_count,
    smem_per_block,
)
from engine.backends.cuda.modules import module
from engine.backends.cuda.norms import Norms
from engine.backends.cuda.projection_tuning import ProjectionTuner
from engine.backends.cuda.w4_mma import W4Route, w4_mma
from engine.backends.cuda.weights import DWeight, QWeight

i32, f32 = np.int32, np.float32


@dataclass(frozen=True)
class Pro:
    """A gemv4 prologue. ADD_NORM: stage `rms_norm(x + delta) * norm` (delta may be None)
    and store `x + delta` to `h` (None: not stored). GATED_NORM: stage
    `rms_norm_per_head(o) * norm * silu(x)` with heads of `head_dim` values (o fp32)."""

    kind: Prologue
    norm: Any
    eps: float
    delta: Any = None
    h: Any = None
    o: Any = None
    head_dim: int = 0


def _wargs(w: Any) -> tuple[Any, Any, Any]:
    if isinstance(w, QWeight):
        return w.packed, w.scales, w.biases
    return w.data, w.data, w.data  # scales/biases unused for dense weights


def _pro_rows(pro: Pro | None, r0: int, r1: int) -> Pro | None:
    """The prologue of rows r0..r1 of a launch (its per-row inputs and outputs cut)."""
    if pro is None:
        return None

    def cut(a: Any) -> Any:
        return None if a is None else a[r0:r1]

    return replace(pro, delta=cut(pro.delta), h=cut(pro.h), o=cut(pro.o))


def _pro_args(pro: Pro | None) -> tuple:
    """The prologue's kernel arguments (d, nw, h, o, hd, eps), null pointers where unused."""
    if pro is None:
        return (*(or_null(None),) * 4, i32(0), f32(0))
    return (
        or_null(pro.delta),
        pro.norm,
        or_null(pro.h),
        or_null(pro.o),
        i32(pro.head_dim),
        f32(pro.eps),
    )


class Projections:
    """Owns gemv.cu, gemv4.cu, quant.cu's dequantization and blocks, and the cuBLAS product.

    `frame` and `norms` are what the ops (`linear`, `mlp`, ...) carve from and fall back to;
    the kernel-level methods (`gemv`, `gemv_run`, `dequant`, ...) need neither, as tools and
    tests use them.

    `invariant` (EngineSettings.batch_invariant): every row is summed as it is at one row,
    whatever rows share its launch (`gemv`). `step`, set by the backend for each forward:
    whether it is a decode step (then rows past GEMV_MAX_ROWS stay on the decode kernels in
    that mode, a launch per GEMV_MAX_ROWS; a prompt's window of more rows keeps cuBLAS)."""

    # Extra -D flags for gemv4.cu (tools/profile_step.py --stamps compiles its clock records in).
    gemv4_defines: tuple[str, ...] = ()

    def __init__(
        self,
        kernels: Kernels,
        frame: Frame | None = None,
        norms: Norms | None = None,
        invariant: bool = False,
    ) -> None:
        self.k, self.frame, self.norms = kernels, frame, norms
        self.invariant, self.step = invariant, False
        self.dtype = kernels.dtype
        self.tuner = ProjectionTuner(kernels.dtype)
        self._mma_ok: bool | None = None
        self._resident: dict[tuple, int] = {}  # (kernel, threads, smem) -> blocks at once
        self._gemv4_modules: dict[tuple, Any] = {}  # (rows, swiglu, prologue) -> module
        self._gemv4_kernels: dict[str, Any] = {}  # symbol -> kernel
        self.w4 = W4Route(kernels)  # 4-bit prompt products: w4_mma or dequantize + cuBLAS

    # ----- the ops ------------------------------------------------------------------------
    def linear(self, x: Any, w: Any) -> Any:
        out = self.frame.take((x.shape[0], w.shape[0]))
        self.linear_into(x, w, out)
        return out

    def linear_into(self, x: Any, w: Any, out: Any) -> None:
        if self.gemv_ok(w, x.shape[0]):
            self.gemv(x, w, out)
            return
        if isinstance(w, QWeight):
            if self.w4.wants(x, w, out, lambda a, o: self._dequantized(a, w, o)):
                w4_mma(self.k, x, w, out)  # the codes read directly (w4_mma.W4Route)
                return
            self._dequantized(x, w, out)
            return
        self.gemm(x, w.data if isinstance(w, DWeight) else w, out)

    def _dequantized(self, x: Any, w: QWeight, out: Any) -> None:
        """out = x @ w.T: w dequantized into the workspace, then cuBLAS."""
        ws = self.frame.workspace
        ws.begin("ws")
        dense = ws.take(w.shape, self.k.act_dtype)
        self.dequant(w, dense)
        self.gemm(x, dense, out)

    def one_product(self, rows: int, weights: list[Any]) -> Any:
        """The one weight that computes all of `weights` in a single launch: the weight
        itself, or at one row the stored group (weights.FUSED_GROUPS) they are parts of."""
        if len(weights) == 1:
            return weights[0]
        first = weights[0]
        fused = first.fused if isinstance(first, QWeight) else None
        whole = (
            fused is not None
            and rows == 1
            and all(isinstance(w, QWeight) and w.fused is fused for w in weights)
            and sum(w.shape[0] for w in weights) == fused.shape[0]
            and self.gemv_ok(fused, 1)
        )
        return fused if whole else None

    @staticmethod
    def parts(out: Any, weights: list[Any]) -> list[Any]:
        """Each part's columns of the output of their group's product."""
        if len(weights) == 1:
            return [out]
        return [out[:, w.row0 : w.row0 + w.shape[0]] for w in weights]

    def linear_many(self, x: Any, weights: list[Any]) -> list[Any]:
        """A one-row step multiplies a stored group in one launch and hands out each part's
        slice of the output; anything else runs part by part."""
        product = self.one_product(x.shape[0], weights)
        if product is None or len(weights) == 1:
            order = self.group_order(x, weights)
            if order is None:
                return [self.linear(x, w) for w in weights]
            outs = [self.frame.take((x.shape[0], w.shape[0])) for w in weights]
            for w, out in zip(weights, outs, strict=True):
                self.gemv(x, w, out, order=order)
            return outs
        out = self.frame.take((1, product.shape[0]))
        self.gemv(x, product, out)
        return self.parts(out, weights)

    def norm_linear_many(
        self, x: Any, delta: Any, weight: Any, eps: float, weights: list[Any]
    ) -> tuple[list[Any], Any] | None:
        """Add, norm and projection in one gemv4 launch where it applies (`pro_ok`), else
        None (nothing done)."""
        product = self.one_product(x.shape[0], weights)
        if product is None and self.invariant_at(x.shape[0]):
            return self._norm_parts(x, delta, weight, eps, weights)
        if product is None or not self.pro_ok(x, product, Prologue.ADD_NORM):
            return None
        h = x if delta is None else self.frame.take(x.shape)
        out = self.frame.take((x.shape[0], product.shape[0]))
        pro = Pro(Prologue.ADD_NORM, weight, eps, delta=delta, h=None if delta is None else h)
        self.gemv(x, product, out, pro=pro)
        return self.parts(out, weights), h

    def _norm_parts(
        self, x: Any, delta: Any, weight: Any, eps: float, weights: list[Any]
    ) -> tuple[list[Any], Any] | None:
        """Batch-invariant mode, a stored group at more than one row: part by part, each
        launch with the add + norm and the sum order of the group's one-row launch, so each
        row comes out as that launch gives it; None (nothing done) where the group does not
        run as one product with the prologue at one row."""
        fused = self.one_product(1, weights) if len(weights) > 1 else None
        if fused is None or not self.pro_ok(x, fused, Prologue.ADD_NORM):
            return None
        h = x if delta is None else self.frame.take(x.shape)
        pro = Pro(Prologue.ADD_NORM, weight, eps, delta=delta, h=None if delta is None else h)
        order = self.one_row_order(x, fused, None, pro)
        outs = [self.frame.take((x.shape[0], w.shape[0])) for w in weights]
        for i, (w, out) in enumerate(zip(weights, outs, strict=True)):
            self.gemv(x, w, out, pro=pro if i == 0 else replace(pro, h=None), order=order)
        return outs, h

    def norm_mlp(
        self, x: Any, delta: Any, weight: Any, eps: float, gate: Any, up: Any, down: Any
    ) -> tuple[Any, Any] | None:
        """Add, norm and the SwiGLU's gate and up in one launch where it applies, then down;
        else None (nothing done)."""
        if type(gate) is not type(up) or not self.pro_ok(x, gate, Prologue.ADD_NORM):
            return None
        h = self.frame.take(x.shape)
        act = self.frame.take((x.shape[0], gate.shape[0]))
        pro = Pro(Prologue.ADD_NORM, weight, eps, delta=delta, h=h)
        self.gemv(x, gate, act, up=up, pro=pro)
        return self.linear(act, down), h

    def mlp(self, x: Any, gate: Any, up: Any, down: Any) -> Any:
        R = x.shape[0]
        h = self.frame.take((R, gate.shape[0]))
        if type(gate) is type(up) and self.gemv_ok(gate, R):
            self.gemv(x, gate, h, up=up)
        else:
            g, u = self.linear(x, gate), self.linear(x, up)
            self.norms.swiglu(g, u, h)
        return self.linear(h, down)

    # ----- which kernel -------------------------------------------------------------------
    def invariant_at(self, rows: int) -> bool:
        """Whether a launch of `rows` rows sums each row as at one row: in the batch-invariant
        mode, every decode step and every launch of up to GEMV_MAX_ROWS rows. A prompt's
        larger windows take the products made for many rows (cuBLAS): a window is never
        shared with other streams (the scheduler prefills one stream's window at a time, at
        the same boundaries alone or beside others), so its sums do not depend on them, and
        running it in one-row launches took a 256-token prompt 340 ms on the H200."""
        return self.invariant and (rows <= GEMV_MAX_ROWS or self.step)

    def fit_rows(self, rows: int) -> int:
        """The rows a decode kernel's fit is judged at. Batch-invariant (`invariant_at`):
        one (`gemv` launches more rows in parts), so any batch takes the kernels a row alone
        takes."""
        return 1 if self.invariant_at(rows) else rows

    def gemv_ok(self, w: Any, rows: int) -> bool:
        bits, blocked = (w.bits, w.blocked) if isinstance(w, QWeight) else (0, False)
        isz, R = self.k.act_itemsize, self.fit_rows(rows)
        return gemv_fits(R, w.shape[1], bits, blocked, isz, self._mma(), smem_per_block())

    def blocks_ok(self, bits: int, group_size: int, cols: int) -> bool:
        """Whether a quantized matrix is stored in 8-row blocks (`blocked_layout`)."""
        return blocked_layout(self.dtype, bits, group_size, cols, self._mma(), smem_per_block())

    def pro_ok(self, x: Any, w: Any, kind: Prologue, head_dim: int = 0) -> bool:
        """Whether gemv4 can run `x @ w.T` with prologue `kind` (else: separate kernels)."""
        R, cols = x.shape
        blocked = isinstance(w, QWeight) and w.blocked
        args = (self.fit_rows(R), cols, w.shape[0], kind, head_dim, blocked, self.dtype)
        if not prologue_fits(*args, self._mma(), smem_per_block(), self.invariant_at(R)):
            return False
        return not (x.data.ptr % 16 or x.strides[1] != x.itemsize or x.strides[0] % 16)

    def _mma(self) -> bool:
        """Whether the GPU runs gemv4 (`card.runs_mma`): older cards (GTX 16xx, RTX 20xx, in
        fp16) run the SIMT kernel and separate norms."""
        if self._mma_ok is None:
            self._mma_ok = runs_mma(compute_capability())
        return self._mma_ok

    def _gemv4_ok(self, x: Any, w: Any, kind: int = Prologue.NONE) -> bool:
        if self.dtype == "float32" or not isinstance(w, QWeight) or not w.blocked:
            return False
        return self._mma() and bool(self._gemv4_variants(x.shape[0], w.shape[1], kind))

    def _gemv4_variants(self, rows: int, cols: int, kind: int) -> list[tuple]:
        return gemv4_variants(rows, cols, kind, smem_per_block())

    def _kind(self, pro: Pro | None) -> int:
        """The PRO template argument of a prologue (`gemv4_kind`)."""
        return gemv4_kind(pro.kind, self.dtype, pro.head_dim) if pro else Prologue.NONE

    # ----- choice and launch --------------------------------------------------------------
    def gemv(
        self,
        x: Any,
        w: Any,
        out: Any,
        up: Any = None,
        pro: Pro | None = None,
        order: tuple | None = None,
    ) -> None:
        """out[m] = x[m] @ w.T for m < rows <= 8; with `up`, out = silu(x@w.T) * (x@up.T);
        with `pro` (gemv4 only, see `pro_ok`), x is first transformed as `Pro` says.

        The kernel and its variant are picked per shape by timing each candidate once
        (outside graph capture); the choice is kept for the process. Batch-invariant
        (`invariant`): `_gemv_rows`, in the sum order `order` (None: this shape's own at one
        row).
        """
        if self.invariant:
            self._gemv_rows(x, w, out, up, pro, order)
            return
        key = self.gemv_key(x, w, up, pro)
        choice = self.tuner.choice.get(key)
        if choice is None:
            choice = self.choose(key, x, w, out, up, pro)
        if self.k.graphing:
            self.tuner.step_keys.append(key)
        self.gemv_run(choice, x, w, out, up, pro)

    @staticmethod
    def gemv_key(x: Any, w: Any, up: Any = None, pro: Pro | None = None) -> tuple:
        """What a tuned choice is kept under: (bits, rows, out, in, swiglu, prologue kind,
        8-row blocks): the two orders of a matrix run different kernels."""
        q = isinstance(w, QWeight)
        bits, blocked = (w.bits, w.blocked) if q else (0, False)
        kind = int(pro.kind) if pro else 0
        return (bits, x.shape[0], w.shape[0], x.shape[1], up is not None, kind, blocked)

    def _gemv_rows(self, x, w, out, up, pro: Pro | None, order: tuple | None) -> None:
        """Batch-invariant: every row summed in the order of this shape's one-row launch
        (or `order`, a stored group's): launches of at most `invariant_rows` rows, each in a
        variant of that order, chosen among those and kept under the key with the order
        appended (the one-row choice of the shape itself is the plain key's)."""
        R, cols = x.shape
        own = order is None
        if own:
            order = self.one_row_order(x, w, up, pro)
        heads = cols // pro.head_dim if pro is not None and pro.head_dim else 0
        n = invariant_rows(R, cols, order, self._kind(pro), heads, smem_per_block())
        for r0 in range(0, R, n):
            r1 = min(R, r0 + n)
            xs, outs, ps = x, out, pro
            if r1 - r0 < R:
                xs, outs, ps = x[r0:r1], out[r0:r1], _pro_rows(pro, r0, r1)
            key = self.gemv_key(xs, w, up, ps)
            if not (own and r1 - r0 == 1):
                key = (*key, order)
            choice = self.tuner.choice.get(key)
            if choice is None:
                choice = self.choose(key, xs, w, outs, up, ps, order)
            if self.k.graphing:
                self.tuner.step_keys.append(key)
            self.gemv_run(choice, xs, w, outs, up, ps)

    def one_row_order(self, x: Any, w: Any, up: Any = None, pro: Pro | None = None) -> tuple:
        """The sum order (`reduction_order`) of this product's one-row launch: the variant
        chosen for it, chosen now (timed on the first row) where none is yet."""
        x1, p1 = x[:1], _pro_rows(pro, 0, 1)
        key = self.gemv_key(x1, w, up, p1)
        choice = self.tuner.choice.get(key)
        if choice is None:
            choice = self.choose(key, x1, w, None, up, p1)
        return reduction_order(choice, x.shape[1])

    def group_order(self, x: Any, weights: list[Any]) -> tuple | None:
        """Batch-invariant, a stored group (weights.FUSED_GROUPS) at more than one row: the
        sum order of the group's one-row launch, which each part's launch then takes (an
        output row's sums do not depend on the rows beside it); else None."""
        if not self.invariant_at(x.shape[0]) or x.shape[0] == 1 or len(weights) == 1:
            return None
        fused = self.one_product(1, weights)
        return None if fused is None else self.one_row_order(x, fused)

    def gemv_candidates(
        self, x: Any, w: Any, up: Any = None, pro: Pro | None = None, order: tuple | None = None
    ) -> list:
        """Kernel variants that can run this product: ('mma', ks, tpb, ug, pipe) for gemv4
        (4-bit weights in 8-row blocks), else ('old', rpw, u) for the SIMT kernel and, for a
        dense matrix outside the batch-invariant mode, ('tc', warps) for gemv_tc; with
        `order`, those that sum each row in that order (`reduction_order`)."""
        kind = self._kind(pro)
        if self._gemv4_ok(x, w, kind):
            cands = [("mma", *v) for v in self._gemv4_variants(x.shape[0], w.shape[1], kind)]
        else:
            assert pro is None, "only gemv4 has prologues"
            cands = [("old", *v) for v in simt_variants(up is not None)]
            if order is None and not self.invariant and self._tc_ok(x, w):
                cands += [("tc", warps) for warps in TC_WARPS]  # gemv_tc.py
        if order is not None:
            cands = order_candidates(cands, w.shape[1], order)
            assert cands, f"no variant sums in the order {order} at {x.shape[0]} rows"
        return cands

    def choose(
        self, key: tuple, x, w, out, up=None, pro: Pro | None = None, order: tuple | None = None
    ) -> tuple:
        """The variant for `key`, timing every candidate once (the first candidate, not
        kept, inside a graph capture or where it is the only one); `order`: among those of
        that sum order. `out` None: only the output's shape is needed (the timing writes
        buffers of its own)."""
        import cupy

        cands = self.gemv_candidates(x, w, up, pro, order)
        current = cupy.cuda.get_current_stream()
        if current.is_capturing() or len(cands) == 1:
            return cands[0]
        # The candidates run on the caller's stream once its queue is empty, into buffers of
        # their own: timing never races with, or writes into, what the forward is using. A
        # prologue that stores the residual stores the same values every time.
        current.synchronize()
        if out is None:
            own_out = cupy.empty((x.shape[0], w.shape[0]), self.k.act_dtype)
        else:
            own_out = cupy.empty(out.shape, out.dtype)
        if pro is not None and pro.h is not None:
            pro = replace(pro, h=cupy.empty(pro.h.shape, pro.h.dtype))
        return self.tuner.rank(key, cands, lambda c: self.gemv_run(c, x, w, own_out, up, pro))

    def _tc_ok(self, x: Any, w: Any) -> bool:
        """A dense matrix gemv_tc covers (16-bit activations, sm_80; x's rows contiguous)."""
        if isinstance(w, QWeight) or x.strides[1] != x.itemsize:
            return False
        return tc_applies(x.shape[0], w.shape[1], self.dtype, compute_capability())

    def gemv_run(self, choice: tuple, x, w, out, up=None, pro: Pro | None = None) -> None:
        if choice[0] == "mma":
            self._gemv4_launch(x, w, out, up, pro, choice[1:])
        elif choice[0] == "tc":
            assert pro is None, "gemv_tc has no prologue"
            tc_launch(self.k, x, w, out, up, choice[1])
        else:
            assert pro is None, "the SIMT kernel has no prologue"
            self._gemv_launch(x, w, out, up, *choice[1:])

    def _gemv4_launch(self, x, w, out, up, pro: Pro | None, v: tuple) -> None:
        R, cols = x.shape
        n_out = w.shape[0]
        swiglu = up is not None
        kind = self._kind(pro)
        fn = self.gemv4_kernel(R, swiglu, v, kind)
        _, threads = gemv4_threads(cols, v)
        smem = gemv4_smem(R, cols, threads, kind)
        self.k.allow_smem(fn, (R, swiglu, v, int(kind)), smem)  # beside the static sums
        blocks = gemv4_blocks(n_out, swiglu, v[1])
        grid = (min(blocks, self._gemv4_resident(fn, threads, smem)),)
        a = _wargs(w)
        b = _wargs(up) if swiglu else a
        ldx = x.strides[0] // x.itemsize
        args = (*a, *b, x, i32(ldx), out, i32(out.shape[1]), i32(n_out), i32(cols))
        args += (*_pro_args(pro), i32(0))  # late = 0: first weights requested before the wait
        self.k.launch(fn, grid, (threads,), args, smem)

    def _gemv4_resident(self, fn: Any, threads: int, smem: int) -> int:
        """Blocks of `fn` the whole GPU holds at once: the grid is capped there and blocks
        loop over the remaining tiles."""
        key = (fn.kernel.ptr, threads, smem)
        n = self._resident.get(key)
        if n is None:
            from cupy_backends.cuda.api import driver

            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
            n = self._resident[key] = max(1, per_sm) * sm_count()
        return n

    gemv4_symbol = staticmethod(gemv4_symbol)

    def gemv4_kernel(self, R: int, swiglu: bool, v: tuple, kind: int = 0) -> Any:
        """The compiled gemv4 kernel of variant `v`. One module per (rows, swiglu, prologue)
        holds every variant: one compile, not nine."""
        sym = self.gemv4_symbol(R, swiglu, v, kind)
        fn = self._gemv4_kernels.get(sym)
        if fn is not None:
            return fn
        mod = self._gemv4_modules.get((R, swiglu, int(kind)))
        if mod is None:
            names = gemv4_module(R, swiglu, kind)
            self.k.check("gemv4.cu", names)
            mod = module("gemv4.cu", self.dtype, names, self.gemv4_compile_defines)
            self._gemv4_modules[(R, swiglu, int(kind))] = mod
        fn = self._gemv4_kernels[sym] = mod.get_function(sym)
        return fn

    @property
    def gemv4_compile_defines(self) -> tuple[str, ...]:
        """The `-D` flags of every gemv4 module (prebuild.py compiles them the same way)."""
        return self.gemv4_defines + (("SNUG_BATCH_INVARIANT",) if self.invariant else ())

    @property
    def gemv4_modules(self) -> list[Any]:
        """The gemv4 modules compiled so far (tools read their stamp records)."""
        return list(self._gemv4_modules.values())

    def _gemv_launch(self, x, w, out, up, rpw: int, u: int) -> None:
        R, cols = x.shape
        n_out = w.shape[0]
        swiglu = up is not None
        bits = w.bits if isinstance(w, QWeight) else 0
        sym = simt_symbol(bits, R, rpw, swiglu, u)
        groups = n_out if swiglu else cdiv(n_out, rpw)
        grid = (max(1, min(cdiv(groups, 8), grid_cap())),)
        a = _wargs(w)
        b = _wargs(up) if swiglu else a
        g = w.group_size if bits else 64
        args = (*a, *b, x, i32(cols), out, i32(out.shape[1]), i32(n_out), i32(cols), i32(g))
        self.k.launch(self.k.fn("gemv.cu", sym), grid, (256,), args)

    # ----- prompt-sized products and quantized storage --------------------------------------
    def gemm(self, x: Any, wt: Any, out: Any) -> None:
        """out[R, n] = x[R, k] @ wt[n, k].T with cuBLAS (wt dense, activation type)."""
        R, kdim = x.shape
        n = wt.shape[0]
        t, ldo = self.k.cuda_type, out.shape[1]
        x_ptr, w_ptr, out_ptr = x.data.ptr, wt.data.ptr, out.data.ptr
        blas.matmul(x_ptr, t, kdim, w_ptr, t, kdim, True, out_ptr, t, ldo, R, n, kdim)

    def dequant(self, w: QWeight, out: Any) -> None:
        """out = the dense [rows, cols] matrix of w in the activation type."""
        rows, cols = w.shape
        nwords = rows * cols * w.bits // 32
        self.k.run(
            "quant.cu",
            dequant_symbol(w.bits, w.blocked),
            (min(cdiv(nwords, 256), grid_cap() * 4),),
            (256,),
            (w.packed, w.scales, w.biases, out, np.int64(rows), i32(cols), i32(w.group_size)),
        )

    def to_blocks(self, packed: Any, scales: Any, biases: Any) -> None:
        """Rearrange a 4-bit g64 matrix ([rows, in/8] codes, [rows, in/64] scales and biases,
        rows a multiple of 8) in place into the 8-row blocks gemv4 reads (quant.cu)."""
        rows, words = packed.shape
        for a, sym, n, unit in (
            (packed, TO_BLOCKS[0], words, 4),
            (scales, TO_BLOCKS[1], scales.shape[1], 2),
            (biases, TO_BLOCKS[1], biases.shape[1], 2),
        ):
            fn = self.k.fn("quant.cu", sym)
            smem = 8 * n * unit
            self.k.allow_smem(fn, ("to_blocks", sym), smem)
            self.k.launch(fn, (rows // 8,), (256,), (a, i32(n)), smem)
