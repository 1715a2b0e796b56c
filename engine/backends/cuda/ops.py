"""Thin wrappers over the kernels: argument marshalling, grid shapes, nothing else.

`Ops(dtype)` binds one activation dtype ('bfloat16', 'float16' or 'float32'). Output
buffers are passed in by the caller (carved from scratch), so every wrapper is safe inside a
CUDA-graph capture. Half-precision arrays are CuPy float16, bf16 arrays are stored as uint16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda import blas
from engine.backends.cuda.modules import function
from engine.backends.cuda.weights import DWeight, QWeight

i32, f32 = np.int32, np.float32
GEMV_MAX_ROWS = 8
# (rows per warp, 16-byte chunks in flight per lane and row)
GEMV_VARIANTS = ((1, 4), (2, 4), (4, 2), (4, 4))
GEMV_SWIGLU_VARIANTS = ((2, 4), (2, 2), (2, 8))
# Tensor-core kernel for 4-bit g64 weights and half activations (gemv4.cu):
# (warps per 16-row tile or 0 = enough for at most `groups` groups each, tiles per block,
#  groups per load step, next step prefetched)
GEMV4_VARIANTS = (
    (4, 2, 2, True),
    (8, 1, 4, True),
    (16, 1, 2, True),
    (2, 4, 4, True),
    (32, 1, 2, True),
    (0, 1, 8, False),
    (0, 2, 8, False),
    (0, 4, 8, False),
    (0, 2, 4, False),
)
GEMV4_MAXT = 768  # largest block of the auto-sized variants
GRID_CAP = 132 * 16  # blocks for grid-stride kernels


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


_GEMV_CHOICES: dict[str, dict[tuple, tuple]] = {}


class Ops:
    def __init__(self, dtype: str):
        import cupy

        if dtype not in blas.TYPES:
            raise ValueError(f"dtype {dtype!r}: choose bfloat16, float16 or float32")
        self.dtype = dtype
        self.act_dtype = {
            "float32": cupy.float32,
            "float16": cupy.float16,
            "bfloat16": cupy.uint16,
        }[dtype]
        self.act_itemsize = 4 if dtype == "float32" else 2
        self.cuda_type = blas.TYPES[dtype]
        # Shared by every backend of the process: two backends (eager and graphed, or a
        # reload) then sum in the same order and give the same tokens.
        self.gemv_choice: dict[tuple, tuple] = _GEMV_CHOICES.setdefault(dtype, {})
        self._smem_optin: int | None = None
        self._smem_set: dict[tuple, int] = {}
        self._l2_flush: Any = None
        self._gemv4_mods: dict[Any, Any] = {}  # (rows, swiglu) -> module, symbol -> kernel

    def k(self, file: str, symbol: str) -> Any:
        return function(file, symbol, self.dtype)

    # ----- conversions ----------------------------------------------------------------------
    def convert(self, kind: str, src: Any, dst: Any) -> None:
        n = src.size
        self.k("quant.cu", kind)((min(_cdiv(n, 256), GRID_CAP),), (256,), (src, dst, np.int64(n)))

    def to_f32(self, x: Any, out: Any) -> None:
        self.convert("to_f32", x, out)

    # ----- projections ------------------------------------------------------------------------
    def gemv_ok(self, w: Any, rows: int) -> bool:
        if rows > GEMV_MAX_ROWS:
            return False
        cols = w.shape[1]
        if isinstance(w, QWeight):
            return (cols * w.bits) % 128 == 0
        return (cols * self.act_itemsize) % 16 == 0

    def gemv(self, x: Any, w: Any, out: Any, up: Any = None) -> None:
        """out[m] = x[m] @ w.T for m < rows <= 8; with `up`, out = silu(x@w.T) * (x@up.T).

        The kernel and its variant are picked per shape by timing each candidate once
        (outside graph capture); the choice is cached for the process.
        """
        R, cols = x.shape
        bits = w.bits if isinstance(w, QWeight) else 0
        swiglu = up is not None
        key = (bits, R, w.shape[0], cols, swiglu)
        choice = self.gemv_choice.get(key)
        if choice is None:
            choice = self._tune_gemv(key, x, w, out, up)
        self.gemv_run(choice, x, w, out, up)

    def gemv_candidates(self, x: Any, w: Any, up: Any = None) -> list[tuple]:
        """Kernel variants that can run this product: ('mma', ks, tpb, ug) or ('old', rpw, u)."""
        old = GEMV_SWIGLU_VARIANTS if up is not None else GEMV_VARIANTS
        cands = [("old", *v) for v in old]
        if self._gemv4_ok(x, w):
            cands = [("mma", *v) for v in GEMV4_VARIANTS] + cands[:1]
        return cands

    def gemv_run(self, choice: tuple, x: Any, w: Any, out: Any, up: Any = None) -> None:
        if choice[0] == "mma":
            self._gemv4_launch(x, w, out, up, *choice[1:])
        else:
            self._gemv_launch(x, w, out, up, *choice[1:])

    def _gemv4_smem(self, rows: int, cols: int, threads: int) -> int:
        return rows * (cols // 8 + 1) * 16 + cols // 64 * 32 + threads * 16

    def _gemv4_ok(self, x: Any, w: Any) -> bool:
        if self.dtype == "float32" or not isinstance(w, QWeight):
            return False
        if w.bits != 4 or w.group_size != 64 or w.shape[1] % 64:
            return False
        if self._smem_optin is None:
            import cupy

            dev = cupy.cuda.Device().id
            self._smem_optin = cupy.cuda.runtime.deviceGetAttribute(97, dev)  # opt-in max
        return self._gemv4_smem(x.shape[0], w.shape[1], 1024) <= self._smem_optin

    def _gemv4_launch(self, x, w, out, up, ks: int, tpb: int, ug: int, pipe: bool) -> None:
        R, cols = x.shape
        n_out = w.shape[0]
        swiglu = up is not None
        v = (ks, tpb, ug, pipe)
        fn = self._gemv4_fn(R, swiglu, v)
        if ks == 0:
            ks = max(1, min(_cdiv(cols // 64, ug), GEMV4_MAXT // (32 * tpb)))
        threads = 32 * ks * tpb
        smem = self._gemv4_smem(R, cols, threads)
        key = (R, swiglu, v)
        if smem > 48 * 1024 and self._smem_set.get(key, 0) < smem:
            fn.max_dynamic_shared_size_bytes = smem
            self._smem_set[key] = smem
        rows = 8 if swiglu else 16
        grid = (_cdiv(_cdiv(n_out, rows), tpb),)
        a = self._wargs(w)
        b = self._wargs(up) if swiglu else a
        fn(
            grid,
            (threads,),
            (*a, *b, x, i32(cols), out, i32(out.shape[1]), i32(n_out), i32(cols)),
            shared_mem=smem,
        )

    @staticmethod
    def _gemv4_sym(R: int, swiglu: bool, v: tuple) -> str:
        ks, tpb, ug, pipe = v
        maxt = 32 * ks * tpb if ks else GEMV4_MAXT
        sw, pp = ("true" if swiglu else "false"), ("true" if pipe else "false")
        return f"gemv4<{R},{sw},{tpb},{ug},{pp},{maxt}>"

    def _gemv4_fn(self, R: int, swiglu: bool, v: tuple) -> Any:
        """One module per (rows, swiglu) holding every variant: one compile, not nine."""
        import cupy

        from engine.backends.cuda.modules import ACT_KINDS, _source

        sym = self._gemv4_sym(R, swiglu, v)
        fn = self._gemv4_mods.get(sym)
        if fn is not None:
            return fn
        mod = self._gemv4_mods.get((R, swiglu))
        if mod is None:
            names = [self._gemv4_sym(R, swiglu, c) for c in GEMV4_VARIANTS]
            opts = ("-std=c++17", f"-DACT_KIND={ACT_KINDS[self.dtype]}")
            mod = cupy.RawModule(code=_source("gemv4.cu"), options=opts, name_expressions=names)
            self._gemv4_mods[(R, swiglu)] = mod
        fn = self._gemv4_mods[sym] = mod.get_function(sym)
        return fn

    def _gemv_launch(self, x, w, out, up, rpw: int, u: int) -> None:
        R, cols = x.shape
        n_out = w.shape[0]
        swiglu = up is not None
        bits = w.bits if isinstance(w, QWeight) else 0
        sym = f"gemv<{bits},{R},{rpw},{'true' if swiglu else 'false'},{u}>"
        groups = n_out if swiglu else _cdiv(n_out, rpw)
        grid = (max(1, min(_cdiv(groups, 8), GRID_CAP)),)
        a = self._wargs(w)
        b = self._wargs(up) if swiglu else a
        g = w.group_size if bits else 64
        self.k("gemv.cu", sym)(
            grid,
            (256,),
            (*a, *b, x, i32(cols), out, i32(out.shape[1]), i32(n_out), i32(cols), i32(g)),
        )

    def _tune_gemv(self, key, x, w, out, up) -> tuple:
        import cupy

        cands = self.gemv_candidates(x, w, up)
        if cupy.cuda.get_current_stream().is_capturing() or len(cands) == 1:
            return cands[0]
        times = [self.time_gemv(c, x, w, out, up) for c in cands]
        best = cands[times.index(min(times))]
        self.gemv_choice[key] = best
        return best

    def time_gemv(self, choice: tuple, x, w, out, up=None, n: int = 8) -> float:
        """GPU ms of n launches, each after a write that evicts the L2 (weights come from
        memory, as in a decode step), replayed as one CUDA graph; the writes cost the same for
        every candidate, so only the ranking means anything."""
        import cupy

        if self._l2_flush is None:
            dev = cupy.cuda.Device().id
            l2 = cupy.cuda.runtime.deviceGetAttribute(38, dev)  # L2 cache bytes
            self._l2_flush = cupy.empty(max(l2 * 5 // 4, 1 << 20), cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            self.gemv_run(choice, x, w, out, up)  # compile, set attributes, warm
            stream.begin_capture()
            for _ in range(n):
                self._l2_flush.fill(0)
                self.gemv_run(choice, x, w, out, up)
            graph = stream.end_capture()
            graph.launch(stream)
            best = float("inf")
            for _ in range(2):
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                e0.record(stream)
                graph.launch(stream)
                e1.record(stream)
                e1.synchronize()
                best = min(best, cupy.cuda.get_elapsed_time(e0, e1))
        return best

    @staticmethod
    def _wargs(w: Any) -> tuple[Any, Any, Any]:
        if isinstance(w, QWeight):
            return w.packed, w.scales, w.biases
        return w.data, w.data, w.data  # scales/biases unused for dense weights

    def dequant(self, w: QWeight, out: Any) -> None:
        nwords = w.packed.size
        self.k("quant.cu", f"dequant<{w.bits}>")(
            (min(_cdiv(nwords, 256), GRID_CAP * 4),),
            (256,),
            (
                w.packed,
                w.scales,
                w.biases,
                out,
                np.int64(nwords),
                i32(w.shape[1]),
                i32(w.group_size),
            ),
        )

    def gemm(self, x: Any, wt: Any, out: Any) -> None:
        """out[R, n] = x[R, k] @ wt[n, k].T with cuBLAS (wt dense, activation type)."""
        R, kdim = x.shape
        n = wt.shape[0]
        t = self.cuda_type
        blas.matmul(
            x.data.ptr,
            t,
            kdim,
            wt.data.ptr,
            t,
            kdim,
            True,
            out.data.ptr,
            t,
            out.shape[1],
            R,
            n,
            kdim,
        )

    def embedding(self, table: Any, ids: Any, out: Any) -> None:
        R, cols = out.shape
        if isinstance(table, QWeight):
            self.k("quant.cu", f"embed_q<{table.bits}>")(
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
            self.k("quant.cu", "embed_dense")((R,), (256,), (data, ids, out, i32(cols)))

    def gather_rows(self, x: Any, rows: Any, out: Any) -> None:
        self.k("quant.cu", "gather_rows")((out.shape[0],), (256,), (x, rows, out, i32(x.shape[1])))

    # ----- norms and elementwise -----------------------------------------------------------
    def rms_norm(self, x: Any, w: Any, out: Any, eps: float) -> None:
        R, n = x.shape
        self.k("norm.cu", "rms_norm")(
            (R,), (min(1024, _cdiv(n, 32) * 32),), (x, w, out, i32(n), f32(eps))
        )

    def add_rms_norm(self, x: Any, d: Any, w: Any, out: Any, h: Any, eps: float) -> None:
        R, n = x.shape
        self.k("norm.cu", "add_rms_norm")(
            (R,), (min(1024, _cdiv(n, 32) * 32),), (x, d, w, out, h, i32(n), f32(eps))
        )

    def swiglu(self, g: Any, u: Any, out: Any) -> None:
        n = g.size
        self.k("norm.cu", "swiglu")(
            (min(_cdiv(n, 256), GRID_CAP),), (256,), (g, u, out, np.int64(n))
        )

    # ----- attention --------------------------------------------------------------------------
    def attn_prep(self, qg, k, v, qn, kn, meta, qout, kc, vc, heads, rot, ctx, theta, eps):
        Hq, Hkv, hd = heads
        R = qg.shape[0]
        pos, row_slot, row_tl, row_n = meta
        self.k("attention.cu", "attn_prep")(
            (R, Hq + Hkv),
            (hd,),
            (
                qg,
                k,
                v,
                qn,
                kn,
                pos,
                row_slot,
                row_tl,
                row_n,
                qout,
                kc,
                vc,
                i32(Hq),
                i32(Hkv),
                i32(hd),
                i32(rot),
                i32(ctx),
                np.float64(theta),
                f32(eps),
            ),
            shared_mem=hd * 4,
        )

    def attn_decode(self, q, kc, vc, pos, row_slot, po, pml, heads, ctx, split, nsmax):
        Hq, Hkv, hd = heads
        R = q.shape[0]
        self.k("attention.cu", f"attn_decode<{hd // 32}>")(
            (nsmax, Hkv, R),
            (128,),
            (
                q,
                kc,
                vc,
                pos,
                row_slot,
                po,
                pml,
                i32(Hq),
                i32(Hkv),
                i32(ctx),
                i32(split),
                i32(nsmax),
                f32(hd**-0.5),
            ),
        )

    def attn_combine(self, po, pml, qg, pos, out, heads, split, nsmax):
        Hq, _, hd = heads
        self.k("attention.cu", "attn_combine")(
            (out.shape[0], Hq),
            (hd,),
            (po, pml, qg, pos, out, i32(Hq), i32(hd), i32(split), i32(nsmax)),
        )

    def softmax_causal(self, scores, probs, tq, t0, start, L):
        rows = scores.size // L
        self.k("attention.cu", "softmax_causal")(
            (rows,), (256,), (scores, probs, i32(tq), i32(t0), i32(start), i32(L))
        )

    def attn_gate(self, o, qg, out, rows, row0, Hq, hd):
        self.k("attention.cu", "attn_gate")(
            (rows, Hq), (hd,), (o, qg, out, i32(rows), i32(row0), i32(Hq), i32(hd))
        )

    # ----- gated deltanet ---------------------------------------------------------------------
    def gdn_prep(self, mixed, conv_w, cstate, a, b, A_log, dt_bias, row_slot, row_tl, outs, dims):
        Hk, Hv, dk, dv, K = dims
        R = mixed.shape[0]
        self.k("gdn.cu", "gdn_prep")(
            (R, 2 * Hk + Hv + 1),
            (128,),
            (
                mixed,
                conv_w,
                cstate,
                a,
                b,
                A_log,
                dt_bias,
                row_slot,
                row_tl,
                *outs,
                i32(Hk),
                i32(Hv),
                i32(dk),
                i32(dv),
                i32(K),
            ),
        )

    def gdn_conv_state(self, mixed, cstate, segs, n_segs, C, K):
        self.k("gdn.cu", "gdn_conv_state")(
            (_cdiv(C, 256), n_segs), (256,), (mixed, cstate, *segs, i32(C), i32(K))
        )

    def gdn_scan(self, q, k, v, g, beta, state, segs, n_segs, o, Hk, Hv, dv):
        nc = 4
        self.k("gdn.cu", f"gdn_scan<{nc}>")(
            (Hv * dv // (nc * 4), n_segs),
            (128,),
            (q, k, v, g, beta, state, *segs, o, i32(Hk), i32(Hv), i32(dv)),
        )

    def gdn_out(self, o, z, w, y, Hv, dv, eps):
        self.k("gdn.cu", "gdn_out")(
            (o.shape[0], Hv), (128,), (o, z, w, y, i32(Hv), i32(dv), f32(eps))
        )

    # ----- sampling ---------------------------------------------------------------------------
    def argmax(self, logits, nvalid, out):
        self.k("sample.cu", "argmax_rows")(
            (logits.shape[0],), (1024,), (logits, i32(logits.shape[1]), i32(nvalid), out)
        )

    def advance(self, pos, n):
        self.k("sample.cu", "advance_positions")((_cdiv(n, 256),), (256,), (pos, i32(n)))

    def sample(self, logits, nvalid, top_k, top_p, temperature, seed, counter, out):
        self.k("sample.cu", "sample_topk_topp")(
            (logits.shape[0],),
            (1024,),
            (
                logits,
                i32(logits.shape[1]),
                i32(nvalid),
                i32(top_k),
                f32(top_p),
                f32(temperature),
                np.uint64(seed),
                counter,
                out,
            ),
        )
