"""Thin wrappers over the kernels: argument marshalling, grid shapes, nothing else.

`Ops(dtype)` binds one activation dtype ('bfloat16', 'float16' or 'float32'). Output
buffers are passed in by the caller (carved from scratch), so every wrapper is safe inside a
CUDA-graph capture. Half-precision arrays are CuPy float16, bf16 arrays are stored as uint16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda import blas
from engine.backends.cuda.gemv import (
    _GEMV_CHOICES,
    _GEMV_RANKED,
    _STEP_TUNED,
    GRID_CAP,
    GemvMixin,
    _cdiv,
)
from engine.backends.cuda.launch import (
    byte_span,
    compute_capability,
    launch_pdl,
    pdl_available,
    sm_count,
)
from engine.backends.cuda.modules import function
from engine.backends.cuda.sample_ops import SampleMixin
from engine.backends.cuda.weights import DWeight, QWeight

i32, f32 = np.int32, np.float32


def _chunk_smem(gc: int) -> int:
    """Shared-memory bytes of gdn_chunk<gc> (the buffers listed at the top of gdn_chunk.cu)."""
    ldk, ldv, ldc = 129, 33, gc + 1
    return 4 * (2 * gc * ldk + 2 * gc * ldv + 2 * gc * ldc + 128 * ldv + 4 * gc)


class Ops(GemvMixin, SampleMixin):
    # Warm-up re-chooses the one-row step's projections by the step's own time
    # (DecodeGraphs.tune) where a step takes under TUNE_MAX_STEP_S (a large card; on a small
    # one the step is longer and the per-shape choices stand). On the H200, 4B MLX 4-bit:
    # 522 -> 529, 529 -> 539 and 527 -> 534 tok/s in three runs, for 1.6 to 2.0 s at load.
    tune_in_step = True

    def __init__(self, dtype: str, overlap: bool = True):
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
        self.gemv_ranked: dict[tuple, list] = _GEMV_RANKED.setdefault(dtype, {})
        self.step_tuned: set[tuple] = _STEP_TUNED.setdefault(dtype, set())
        self.step_keys: list[tuple] = []  # the choice keys a capture looked up, in order
        self._smem_optin: int | None = None
        self._smem_set: dict[tuple, int] = {}
        self._l2_flush: Any = None
        self._resident: dict[tuple, int] = {}  # (kernel, threads, smem) -> blocks at once
        self._gemv4_mods: dict[Any, Any] = {}  # (rows, swiglu, pro) -> module, symbol -> kernel
        # Programmatic dependent launch (launch.py) where the GPU and driver have it, for
        # the launches a decode graph records (`graphing`, set while one is captured). Eager
        # launches go through CuPy, whose launch path costs less host time.
        self.pdl = overlap and pdl_available()
        self._chunk_rows: int | None = None  # gdn_chunk rows per chunk (0: not available)
        self.chunked_prefill = True  # windows use gdn_chunk (benchmarks compare both)
        # A decode step's DeltaNet in one launch (gdn_step); off: gdn_prep and gdn_scan
        # (benchmarks compare both).
        self.fused_deltanet_step = True
        # That launch spread over this many blocks a key head (gdn_step_split, a cluster;
        # compute capability 9.0), 0: one block a key head. 4B decode on one H200: 608 / 618
        # tok/s with one block, 627 / 635 with 4, 626 / 632 with 8.
        self.gdn_split = 4
        # The decode graph's DeltaNet step brings out_proj's weights toward L2 while it leaves
        # memory idle. 4B decode on one H200, step-tuned: 682 / 682 tok/s against 678 / 678
        # (and 655 / 656 against 650 / 649 at an earlier commit). The same for o_proj from
        # the attention's split-KV kernel was slower (679 / 673), so that one does not.
        self.l2_ahead = True
        # ... and the first 30% of the next gate's and up's codes after them: 687 / 682
        # against 682 / 677 (60%: 676 / 675; o_proj's weights from attn_combine: 675 / 670).
        self.l2_mlp_fraction = 0.3
        # The draw's two reads of the row with 32 logits a thread in flight (sample.cu, WIDE)
        # instead of one: the same tokens (device tests at c2ee595), 4B replies with the
        # app's defaults 431 -> 453 tok/s.
        self.wide_sampler = True
        # A wide draw of one row with top-k <= 32 over a vocabulary of at least this many:
        # the row's candidates found by DRAW_NB blocks first (draw_candidates), then the
        # draw's block reads those instead of the row. 0: off.
        self.split_draw_min = 1 << 16
        self.graphing = False

    def k(self, file: str, symbol: str) -> Any:
        return function(file, symbol, self.dtype)

    def launch(self, fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        """Every kernel goes through here: with PDL its start overlaps the previous one's end."""
        if self.pdl and self.graphing:
            launch_pdl(fn, grid, block, args, shared_mem)
        else:
            fn(grid, block, args, shared_mem=shared_mem)

    def allow_smem(self, fn: Any, key: tuple, smem: int) -> None:
        """Let kernel `fn` (cached under `key`) take `smem` bytes of dynamic shared memory,
        set once per size. The 48 KiB default counts static shared memory too, so sizes
        above 40 KiB ask for it explicitly."""
        if smem > 40 * 1024 and self._smem_set.get(key, 0) < smem:
            fn.max_dynamic_shared_size_bytes = smem
            self._smem_set[key] = smem

    def run(self, file: str, symbol: str, grid: tuple, block: tuple, args: tuple, smem: int = 0):
        self.launch(self.k(file, symbol), grid, block, args, smem)

    # ----- conversions ----------------------------------------------------------------------
    def convert(self, kind: str, src: Any, dst: Any) -> None:
        n = src.size
        self.run("quant.cu", kind, (min(_cdiv(n, 256), GRID_CAP),), (256,), (src, dst, np.int64(n)))

    def to_f32(self, x: Any, out: Any) -> None:
        self.convert("to_f32", x, out)

    def dequant(self, w: QWeight, out: Any) -> None:
        rows, cols = w.shape
        nwords = rows * cols * w.bits // 32
        self.run(
            "quant.cu",
            f"dequant<{w.bits},{int(w.blocked)}>",
            (min(_cdiv(nwords, 256), GRID_CAP * 4),),
            (256,),
            (w.packed, w.scales, w.biases, out, np.int64(rows), i32(cols), i32(w.group_size)),
        )

    def to_blocks(self, packed: Any, scales: Any, biases: Any) -> None:
        """Rearrange a 4-bit g64 matrix ([rows, in/8] codes, [rows, in/64] scales and biases,
        rows a multiple of 8) in place into the 8-row blocks gemv4 reads (quant.cu)."""
        rows, words = packed.shape
        for a, sym, n, unit in (
            (packed, "to_blocks<unsigned,8>", words, 4),
            (scales, "to_blocks<unsigned short,1>", scales.shape[1], 2),
            (biases, "to_blocks<unsigned short,1>", biases.shape[1], 2),
        ):
            fn = self.k("quant.cu", sym)
            smem = 8 * n * unit
            self.allow_smem(fn, ("to_blocks", sym), smem)
            self.launch(fn, (rows // 8,), (256,), (a, i32(n)), smem)

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
            self.run(
                "quant.cu",
                f"embed_q<{table.bits},{int(table.blocked)}>",
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
            self.run("quant.cu", "embed_dense", (R,), (256,), (data, ids, out, i32(cols)))

    def gather_rows(self, x: Any, rows: Any, out: Any) -> None:
        self.run(
            "quant.cu", "gather_rows", (out.shape[0],), (256,), (x, rows, out, i32(x.shape[1]))
        )

    # ----- norms and elementwise -----------------------------------------------------------
    def rms_norm(self, x: Any, w: Any, out: Any, eps: float) -> None:
        R, n = x.shape
        self.run(
            "norm.cu",
            "rms_norm",
            (R,),
            (min(1024, _cdiv(n, 32) * 32),),
            (x, w, out, i32(n), f32(eps)),
        )

    def add_rms_norm(self, x: Any, d: Any, w: Any, out: Any, h: Any, eps: float) -> None:
        R, n = x.shape
        self.run(
            "norm.cu",
            "add_rms_norm",
            (R,),
            (min(1024, _cdiv(n, 32) * 32),),
            (x, d, w, out, h, i32(n), f32(eps)),
        )

    def swiglu(self, g: Any, u: Any, out: Any) -> None:
        n = g.size
        self.run(
            "norm.cu", "swiglu", (min(_cdiv(n, 256), GRID_CAP),), (256,), (g, u, out, np.int64(n))
        )

    # ----- attention --------------------------------------------------------------------------
    def attn_prep(
        self, qg, k, v, qn, kn, meta, qout, kc, vc, heads, rot, ctx, theta, eps, ahead=()
    ):
        Hq, Hkv, hd = heads
        R = qg.shape[0]
        pos, row_slot, row_tl, row_n = meta
        self.run(
            "attention.cu",
            "attn_prep",
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
            )
            + self._ahead_spans(ahead),
            hd * 4,
        )

    def attn_decode(self, q, kc, vc, pos, row_slot, po, pml, heads, ctx, least, nsmax):
        """Split-KV decode attention: nsmax splits a KV head at most, each of at least
        `least` keys (engine.memory.scratch.decode_splits); partials to po / pml."""
        Hq, Hkv, hd = heads
        R = q.shape[0]
        group = Hq // Hkv
        if group > 8 or hd % 32:
            raise ValueError(
                f"num_attention_heads / num_key_value_heads = {group}, head_dim = {hd}: the "
                "decode attention kernel takes at most 8 query heads per KV head and a head_dim "
                "that is a multiple of 32"
            )
        # (query heads held, keys per warp at a time, warps): fewer keys when more heads are
        # held, so that the registers of both fit. 8 warps take a 32-key split in one round
        # of loads, all before the wait, where the grid is small enough (one block an SM:
        # 176 registers a thread at head_dim 256) and their partials fit in shared memory.
        gm, ku = (4, 4) if group <= 4 else (8, 2)
        nw = 8 if nsmax * Hkv * R <= sm_count() and gm * hd * 4 * 8 <= 32768 else 4
        self.run(
            "attention.cu",
            f"attn_decode<{hd // 32},{gm},{ku},{nw}>",
            (nsmax, Hkv, R),
            (32 * nw,),
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
                i32(least),
                i32(nsmax),
                f32(hd**-0.5),
            ),
        )

    def attn_combine(self, po, pml, qg, pos, out, heads, least, nsmax):
        Hq, _, hd = heads
        self.run(
            "attention.cu",
            "attn_combine",
            (out.shape[0], Hq),
            (hd,),
            (po, pml, qg, pos, out, i32(Hq), i32(hd), i32(least), i32(nsmax)),
        )

    def softmax_causal(self, scores, probs, tq, t0, start, L):
        rows = scores.size // L
        self.run(
            "attention.cu",
            "softmax_causal",
            (rows,),
            (256,),
            (scores, probs, i32(tq), i32(t0), i32(start), i32(L)),
        )

    def attn_gate(self, o, qg, out, rows, row0, Hq, hd):
        self.run(
            "attention.cu",
            "attn_gate",
            (rows, Hq),
            (hd,),
            (o, qg, out, i32(rows), i32(row0), i32(Hq), i32(hd)),
        )

    # ----- gated deltanet ---------------------------------------------------------------------
    def gdn_prep(
        self,
        mixed,
        conv_w,
        cstate,
        a,
        b,
        A_log,
        dt_bias,
        row_slot,
        row_tl,
        outs,
        dims,
        update_state=False,
    ):
        Hk, Hv, dk, dv, K = dims
        R = mixed.shape[0]
        self.run(
            "gdn.cu",
            "gdn_prep",
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
                i32(1 if update_state else 0),
            ),
        )

    def gdn_step_shape(self, Hk: int, Hv: int, dk: int, dv: int) -> tuple[int, int] | None:
        """(columns per warp, threads) of `gdn_step` for these head sizes, or None where it
        does not apply (then a step runs gdn_prep and gdn_scan)."""
        if not self.fused_deltanet_step or dk != 128 or Hv % Hk or Hv // Hk > 8:
            return None
        gv = Hv // Hk
        cols = gv * dv
        for nc in (4, 8):
            threads = cols // nc * 32
            if cols <= 256 and dv % nc == 0 and 2 * dk + cols + gv <= threads <= 1024:
                return nc, threads
        return None

    def gdn_split_shape(self, Hk: int, Hv: int, dk: int, dv: int) -> tuple[int, int] | None:
        """(columns per warp, threads) of `gdn_step_split` over `gdn_split` blocks a key
        head, or None where it does not apply (then one block takes a key head)."""
        P = self.gdn_split
        if not P or not self.gdn_step_shape(Hk, Hv, dk, dv):
            return None
        cols = Hv // Hk * dv
        if compute_capability() < 90 or cols % P or dv % (cols // P):
            return None
        cb = cols // P
        for nc in (8, 4, 2, 1):
            threads = cb // nc * 32
            if cb % nc == 0 and 2 * dk + cb + 1 <= threads <= 1024:
                return nc, threads
        return None

    def gdn_step(
        self,
        mixed,
        conv_w,
        cstate,
        a,
        b,
        A_log,
        dt_bias,
        state,
        segs,
        n_segs,
        o,
        dims,
        ahead=(),
    ):
        """A decode step's conv, gates and delta rule in one launch (`gdn_step` in gdn.cu, or
        `gdn_step_split` where `gdn_split_shape` allows); the caller has checked
        `gdn_step_shape` and a conv of at most 4 taps. `ahead`: the weights read next
        (out_proj, gate, up), which the launch brings toward L2 (`_ahead_spans`)."""
        Hk, Hv, dk, dv, K = dims
        split = self.gdn_split_shape(Hk, Hv, dk, dv)
        if split is not None:
            (nc, threads), P = split, self.gdn_split
            sym, grid = f"gdn_step_split<{nc},{P}>", (Hk * P, n_segs)
        else:
            nc, threads = self.gdn_step_shape(Hk, Hv, dk, dv)
            sym, grid = f"gdn_step<{nc}>", (Hk, n_segs)
        self.run(
            "gdn.cu",
            sym,
            grid,
            (threads,),
            (mixed, conv_w, cstate, a, b, A_log, dt_bias, state, *segs[:2], o)
            + (i32(Hk), i32(Hv), i32(dv), i32(K))
            + self._ahead_spans(ahead),
        )

    def _ahead_spans(self, ahead: tuple) -> tuple:
        """gdn_step's or attn_prep's three (pointer, bytes) arguments for what it brings
        toward L2: all of the first weight (out_proj or o_proj), the first `l2_mlp_fraction`
        of the next two's codes (gate and up); null where `l2_ahead` is off or a weight is
        not quantized."""
        out = ()
        for i in range(3):
            w = ahead[i] if self.l2_ahead and i < len(ahead) else None
            if not isinstance(w, QWeight):
                out += byte_span(None)
            elif i == 0:
                out += byte_span(w)
            else:
                n = int(w.packed.nbytes * self.l2_mlp_fraction) & ~15
                out += (np.uint64(w.packed.data.ptr), np.int64(n))
        return out

    def gdn_conv_state(self, mixed, cstate, segs, n_segs, C, K):
        self.run(
            "gdn.cu",
            "gdn_conv_state",
            (_cdiv(C, 256), n_segs),
            (256,),
            (mixed, cstate, *segs, i32(C), i32(K)),
        )

    def gdn_scan(self, q, k, v, g, beta, state, segs, n_segs, o, Hk, Hv, dv):
        nc = 4
        self.run(
            "gdn.cu",
            f"gdn_scan<{nc}>",
            (Hv * dv // (nc * 4), n_segs),
            (128,),
            (q, k, v, g, beta, state, *segs, o, i32(Hk), i32(Hv), i32(dv)),
        )

    def gdn_chunk_rows(self) -> int:
        """Rows per chunk of `gdn_chunk`: the largest whose shared memory the GPU gives one
        block (64 on Hopper and Ada data-centre parts, 32 on most consumer cards)."""
        if self._chunk_rows is None:
            import cupy

            dev = cupy.cuda.Device().id
            optin = cupy.cuda.runtime.deviceGetAttribute(97, dev)  # opt-in max per block
            fits = [gc for gc in (64, 32, 16) if _chunk_smem(gc) <= optin]
            self._chunk_rows = fits[0] if fits else 0
        return self._chunk_rows

    def gdn_chunk(self, q, k, v, g, beta, state, segs, n_segs, o, Hk, Hv, dv) -> bool:
        """The delta rule over windows in chunks (gdn_chunk.cu); False (nothing launched)
        where the GPU's shared memory or the head size does not allow it."""
        gc = self.gdn_chunk_rows()
        if not gc or dv % 32:
            return False
        fn = self.k("gdn_chunk.cu", f"gdn_chunk<{gc}>")
        smem = _chunk_smem(gc)
        self.allow_smem(fn, ("gdn_chunk", gc), smem)
        args = (q, k, v, g, beta, state, *segs, o, i32(Hk), i32(Hv), i32(dv))
        self.launch(fn, (Hv, dv // 32, n_segs), (256,), args, smem)
        return True

    def gdn_out(self, o, z, w, y, Hv, dv, eps):
        self.run(
            "gdn.cu", "gdn_out", (o.shape[0], Hv), (128,), (o, z, w, y, i32(Hv), i32(dv), f32(eps))
        )
