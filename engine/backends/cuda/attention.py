"""Gated full attention on the CUDA backend (attention.cu, cuBLAS for prompts).

Every forward starts with `attn_prep`: q/k RMSNorm, partial RoPE, the KV-cache append. A
decode step then runs the split-KV `attn_decode` (partials per split) and `attn_combine`
(the output gate fused in); a step's prep also brings the weights read next toward L2.

A window (prefill) runs per segment. In bf16 and fp16 on tensor-core GPUs (sm_80 and newer)
one launch of `attn_prefill` (attn_prefill.cu, `prefill_kernel`) does it all: a block takes
64 query rows of one head through the keys they see with an online softmax and stores the
gated output, so no scores are written. Elsewhere (fp32, sm_75) it runs in chunks of query
rows sized to the workspace: for each chunk and KV head, one strided-batched GEMM forms the
scores of the `Hq / Hkv` query heads that share it (fp32, scaled by hd^-1/2),
`softmax_causal` turns them into probabilities in the activation type (zero past each row's
last visible key), a second GEMM multiplies them by V, and `attn_gate` applies the output
gate.

With the 8-bit KV cache (`StreamState.kv_int8`: codes and a scale per token and KV head,
engine/backends/kv_int8.py) `attn_prep_q8` writes the codes and scales and a step reads them
with `attn_decode_q8`. A window runs per KV head: `kv_dequant` writes the head's keys and
values of the segment so far into the workspace in the activation type, and the same
products as above (or `attn_prefill` over that copy) run over them for its query heads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.base import Batch, Segment
from engine.backends.cuda.blas import matmul
from engine.backends.cuda.card import runs_mma
from engine.backends.cuda.frame import Frame
from engine.backends.cuda.launch import (
    Kernels,
    ahead_spans,
    cdiv,
    compute_capability,
    sm_count,
    smem_per_block,
)
from engine.backends.cuda.state import StreamState
from engine.backends.cuda.tuning import Tuning
from engine.memory.arena import ALIGN
from engine.memory.scratch import decode_splits
from engine.memory.workspace import FUSED_HEAD_DIMS

i32, f32 = np.int32, np.float32
SCORE_BUDGET = 512 << 20  # bytes of scores + probabilities per chunk without a workspace
MAX_GROUP = 8  # query heads a KV head that attn_decode holds at most
COMBINE_SPLITS = 128  # splits attn_combine merges at most (32 a chunk, 4 chunks)
STATIC_SMEM = 48 * 1024  # static shared memory a kernel may declare


PREFILL_WARPS = 4  # attn_prefill: 16 query rows a warp, 64 a block
PREFILL_KEYS = 32  # keys a tile of attn_prefill


def prefill_smem(hd: int, stages: int, warps: int = PREFILL_WARPS) -> int:
    """Dynamic shared bytes of attn_prefill: the block's queries and `stages` tiles of keys
    and values, rows padded by 8 elements (attn_prefill.cu)."""
    return (16 * warps + 2 * stages * PREFILL_KEYS) * (hd + 8) * 2


def prefill_kernel(hd: int, dtype: str, capability: int, smem_per_block: int) -> tuple[str, int]:
    """(attn_prefill instance, its dynamic shared bytes) for this head size, activation type
    and card, or ("", 0) where the fused kernel does not run (fp32: the unfused products;
    before sm_80: no bf16 tensor cores or cp.async; a head size it has no instance for; too
    little shared memory). Two tiles of keys in flight where a block may hold them (99 KiB
    at head_dim 256), else one."""
    if dtype == "float32" or not runs_mma(capability) or hd not in FUSED_HEAD_DIMS:
        return "", 0
    for stages in (2, 1):
        smem = prefill_smem(hd, stages)
        if smem <= smem_per_block:
            return f"attn_prefill<{hd},{PREFILL_WARPS},{stages}>", smem
    return "", 0


def decode_held(group: int) -> tuple[int, int]:
    """(query heads held, keys per warp at a time) of attn_decode for `group` query heads a
    KV head: fewer keys when more heads are held, so that the registers of both fit."""
    return (4, 4) if group <= 4 else (8, 2)


def decode_smem(held: int, hd: int, warps: int) -> int:
    """Static shared bytes of attn_decode: each warp's partial output, max and sum per held
    query head (sm_o, sm_m, sm_l in attention.cu)."""
    return 4 * warps * held * (hd + 2)


def decode_kernel(
    group: int,
    hd: int,
    nsmax: int,
    Hkv: int,
    R: int,
    sm_count: int,
    invariant: bool = False,
    q8: bool = False,
) -> tuple[str, int]:
    """(attn_decode instance, warps a block) of a step's grid (nsmax, Hkv, R). 8 warps take a 32-key
    split in one round of loads, all before the wait, where the grid is small enough (one
    block an SM: 176 registers a thread at head_dim 256) and their partials fit in the
    kernel's 32 KiB of static shared memory for them; else 4. The warps split each split's
    keys among them (a warp takes every NW-th run of keys) and their partials merge in warp
    order, so a row's sums depend on them: batch-invariant (`invariant`), every grid takes 8
    where their partials fit (as a one-row step's small grid does), whatever its splits and
    rows. `q8`: the instance that reads the 8-bit cache (attn_decode_q8), with the same
    geometry."""
    gm, ku = decode_held(group)
    small = invariant or nsmax * Hkv * R <= sm_count
    nw = 8 if small and gm * hd * 4 * 8 <= 32768 else 4
    name = "attn_decode_q8" if q8 else "attn_decode"
    return f"{name}<{hd // 32},{gm},{ku},{nw}>", nw


class Attention:
    """Owns attention.cu and the prefill products. `step_splits`, set while the decode graph
    for short rows is captured (graphs.py), caps the split-KV grid."""

    def __init__(self, kernels: Kernels, frame: Frame, state: StreamState, tuning: Tuning):
        self.k, self.frame, self.state, self.tuning = kernels, frame, state, tuning
        self.step_splits: int | None = None
        self.batch_invariant = False  # the warps a block of attn_decode: decode_kernel
        self._fused: tuple[str, int] | None = None  # prefill_kernel's choice, made once

    def fused_prefill(self) -> tuple[str, int]:
        """`prefill_kernel` for this model, dtype and card ("" where the fused kernel does not
        run)."""
        if self._fused is None:
            hd = self.state.config.head_dim
            self._fused = prefill_kernel(hd, self.k.dtype, compute_capability(), smem_per_block())
        return self._fused

    def flash(self, q, qg, keys, values, out, seg: Segment, row0: int, heads: tuple) -> None:
        """`attn_prefill` for segment `seg` (rows from `row0`): query heads h0 .. h0 + n - 1
        (`heads` = (h0, n, elements from one KV head's keys to the next)) over `keys` /
        `values`, the first of those heads' KV head."""
        c = self.state.config
        Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        sym, smem = self.fused_prefill()
        fn = self.k.fn("attn_prefill.cu", sym)
        self.k.allow_smem(fn, ("attn_prefill", sym), smem)
        h0, n, stride = heads
        scale = hd**-0.5 * 1.4426950408889634  # log2(e): the kernel's exponentials are exp2
        args = (q, qg, keys, values, out, i32(seg.rows), i32(row0), i32(seg.start), i32(Hq),
                i32(Hq // Hkv), i32(h0), np.int64(stride), f32(scale))  # fmt: skip
        self.k.launch(
            fn, (cdiv(seg.rows, 16 * PREFILL_WARPS), n), (32 * PREFILL_WARPS,), args, smem
        )

    def forward(
        self, layer: int, qg: Any, k: Any, v: Any, q_norm: Any, k_norm: Any, batch: Batch, ahead
    ) -> Any:
        """`Backend.attention`: [R, Hq*hd] from the projections of full layer `layer`."""
        import cupy

        c, st, fr = self.state.config, self.state, self.frame
        R = qg.shape[0]
        heads = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        Hq, _, hd = heads
        kc, vc = st.kv_k[layer], st.kv_v[layer]
        scales = (st.kv_k_scale[layer], st.kv_v_scale[layer]) if st.kv_int8 else None
        q = fr.take((R, Hq * hd))
        meta = fr.rows(R)
        # Row by row (positions from `meta`: a graph replays anywhere) where the step
        # buffers hold the rows; the queries then go row-major, as the decode kernels read.
        rowwise = batch.per_row(fr.step_rows)
        prep = (qg, k, v, q_norm, k_norm, meta, q, kc, vc, heads, c.rotary_dim, st.context)
        ahead = ahead if batch.is_step and self.k.prefetch else ()
        self.prep(*prep, c.rope_theta, c.rms_norm_eps, rowwise, ahead, scales)
        out = fr.take((R, Hq * hd))
        if rowwise:
            split, nsmax = decode_splits(st.context, self.step_splits)
            po = fr.take((R, Hq, nsmax, hd), cupy.float32)
            pml = fr.take((R, Hq, nsmax, 2), cupy.float32)
            ctx = st.context
            fresh = max(seg.rows for seg in batch.segments)  # keys prep just wrote, a row
            args = (q, kc, vc, meta[0], meta[1], po, pml, heads, ctx, split, nsmax)
            self.decode(*args, scales, fresh)
            self.combine(po, pml, qg, meta[0], out, heads, split, nsmax)
            return out
        row0, fused = 0, bool(self.fused_prefill()[0])
        for seg in batch.segments:
            if scales is None and fused:
                kv = (kc[seg.slot], vc[seg.slot])  # [Hkv, context, hd] of the stream
                self.flash(q, qg, *kv, out, seg, row0, (0, Hq, st.context * hd))
            elif scales is None:
                self.prefill(q, qg, kc, vc, seg, row0, out)
            else:
                self.prefill_q8(q, qg, (kc, vc), scales, seg, row0, out)
            row0 += seg.rows
        return out

    # ----- kernels ------------------------------------------------------------------------
    def prep(
        self,
        qg,
        k,
        v,
        qn,
        kn,
        meta,
        qout,
        kc,
        vc,
        heads,
        rot,
        ctx,
        theta,
        eps,
        rowwise,
        ahead=(),
        scales=None,
    ):
        """q/k norm and RoPE into `qout` and the KV cache; `ahead` (a step's next weights)
        toward L2. `scales` (the 8-bit cache's key and value scales): codes into kc / vc.
        `rowwise`: `qout` [R, Hq, hd] for the decode kernels, else [Hq, rows, hd] a segment
        for the prefill kernels."""
        Hq, Hkv, hd = heads
        R = qg.shape[0]
        pos, row_slot, row_tl, row_n = meta
        self.k.run(
            "attention.cu",
            "attn_prep" if scales is None else "attn_prep_q8",
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
                *(scales or ()),
                i32(Hq),
                i32(Hkv),
                i32(hd),
                i32(rot),
                i32(ctx),
                np.float64(theta),
                f32(eps),
                i32(rowwise),
            )
            + ahead_spans(ahead, self.tuning),
            hd * 4,
        )

    def decode(
        self, q, kc, vc, pos, row_slot, po, pml, heads, ctx, least, nsmax, scales=None, fresh=1
    ):
        """Split-KV decode attention: nsmax splits a KV head at most, each of at least
        `least` keys (engine.memory.scratch.decode_splits); partials to po / pml. `scales`:
        the 8-bit cache's key and value scales (kc / vc hold codes). `fresh`: the newest
        keys of a row that attn_prep has just written (read only after the kernel waits for
        it; the older ones are requested before): 1 in a step, a verify's rows in one."""
        Hq, Hkv, hd = heads
        R = q.shape[0]
        # support.check_model refused any other shape at load
        assert Hq // Hkv <= MAX_GROUP and hd % 32 == 0, (Hq, Hkv, hd)
        sym, nw = decode_kernel(
            Hq // Hkv, hd, nsmax, Hkv, R, sm_count(), self.batch_invariant, scales is not None
        )
        self.k.run(
            "attention.cu",
            sym,
            (nsmax, Hkv, R),
            (32 * nw,),
            (
                q,
                kc,
                vc,
                *(scales or ()),
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
                i32(fresh),
            ),
        )

    def combine(self, po, pml, qg, pos, out, heads, least, nsmax):
        """The splits' partials into each head's output, times its gate."""
        Hq, _, hd = heads
        # decode_splits caps the grid at scratch.ATTN_SPLITS; the kernel holds that many
        assert nsmax <= COMBINE_SPLITS, (nsmax, COMBINE_SPLITS)
        self.k.run(
            "attention.cu",
            "attn_combine",
            (out.shape[0], Hq),
            (hd,),
            (po, pml, qg, pos, out, i32(Hq), i32(hd), i32(least), i32(nsmax)),
        )

    def softmax_causal(self, scores, probs, tq, t0, start, L):
        rows = scores.size // L
        self.k.run(
            "attention.cu",
            "softmax_causal",
            (rows,),
            (256,),
            (scores, probs, i32(tq), i32(t0), i32(start), i32(L)),
        )

    def gate(self, o, qg, out, rows, row0, Hq, hd):
        self.k.run(
            "attention.cu",
            "attn_gate",
            (rows, Hq),
            (hd,),
            (o, qg, out, i32(rows), i32(row0), i32(Hq), i32(hd)),
        )

    # ----- prefill ------------------------------------------------------------------------
    def prefill(self, q, qg, kc, vc, seg: Segment, row0: int, out) -> None:
        """Attention of segment `seg` (rows from `row0` of the batch) into `out`; `q` holds
        the normalised, rotated queries as `[Hq, rows, hd]` per segment (see attention.cu)."""
        import cupy

        c, kern, fr = self.state.config, self.k, self.frame
        Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        gq, rows, L = Hq // Hkv, seg.rows, seg.start + seg.rows
        isz = kern.act_itemsize
        ws = fr.mem_workspace
        budget = ws.nbytes - 2 * ALIGN if ws is not None and ws.block is not None else SCORE_BUDGET
        tq = max(1, min(rows, budget // (Hq * L * (4 + isz))))
        o = fr.take((Hq, rows, hd))
        qseg = q[row0:]  # [Hq, rows, hd] laid out from row0 * Hq * hd
        for t0 in range(0, rows, tq):
            n = min(tq, rows - t0)
            fr.workspace.begin("ws")
            scores = fr.workspace.take((Hq, n, L), cupy.float32)  # [Hq, n, L]
            probs = fr.workspace.take((Hq, n, L), kern.act_dtype)
            for h in range(Hkv):
                kbase = kc[seg.slot, h]  # [context, hd]
                a_ptr = qseg.data.ptr + ((h * gq * rows + t0) * hd) * isz
                self._scores(a_ptr, kbase.data.ptr, scores[h * gq].data.ptr, n, L, gq, rows)
            self.softmax_causal(scores, probs, n, t0, seg.start, L)
            for h in range(Hkv):
                vbase = vc[seg.slot, h]
                o_ptr = o.data.ptr + ((h * gq * rows + t0) * hd) * isz
                self._values(probs[h * gq].data.ptr, vbase.data.ptr, o_ptr, n, L, gq, rows)
        self.gate(o, qg, out, rows, row0, Hq, hd)

    def _scores(self, q_ptr, k_ptr, s_ptr, n: int, L: int, gq: int, rows: int) -> None:
        """fp32 scores [gq, n, L] = q [gq query heads of one KV head, n rows] . k [L, hd]^T
        / sqrt(hd), one batched product over the KV head's query heads."""
        hd, t = self.state.config.head_dim, self.k.cuda_type
        matmul(q_ptr, t, hd, k_ptr, t, hd, True, s_ptr, 0, L, n, L, hd, alpha=hd**-0.5,
               batch=gq, stride_a=rows * hd, stride_b=0, stride_c=n * L)  # fmt: skip

    def _values(self, p_ptr, v_ptr, o_ptr, n: int, L: int, gq: int, rows: int) -> None:
        """o [gq, n rows of `rows`, hd] = probs [gq, n, L] . v [L, hd]."""
        hd, t = self.state.config.head_dim, self.k.cuda_type
        matmul(p_ptr, t, L, v_ptr, t, hd, False, o_ptr, t, hd, n, hd, L,
               batch=gq, stride_a=n * L, stride_b=0, stride_c=rows * hd)  # fmt: skip

    def dequant(self, codes: tuple, scales: tuple, out: tuple, n: int) -> None:
        """The first `n` keys and values of one KV head of the 8-bit cache (codes, scales:
        each (keys, values)) into `out` (keys, values: [>= n, hd] activation type)."""
        hd = out[0].shape[1]
        self.k.run(
            "attention.cu",
            "kv_dequant",
            (cdiv(n * hd // 4, 256), 2),
            (256,),
            (codes[0], scales[0], codes[1], scales[1], out[0], out[1], i32(n), i32(hd)),
        )

    def prefill_q8(self, q, qg, codes: tuple, scales: tuple, seg: Segment, row0: int, out) -> None:
        """`prefill` over the 8-bit cache (codes and scales: each (keys, values) of the
        layer): per KV head, its L keys and values dequantized into the workspace, then
        `attn_prefill` over them for its query heads, or (where that kernel does not run)
        the scores, softmax and products in chunks of query rows that fit the rest of the
        workspace."""
        import cupy

        c, kern, fr = self.state.config, self.k, self.frame
        Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        gq, rows, L = Hq // Hkv, seg.rows, seg.start + seg.rows
        isz = kern.act_itemsize
        fr.workspace.begin("ws")
        kv = (fr.workspace.take((L, hd)), fr.workspace.take((L, hd)))  # one head's keys, values
        if self.fused_prefill()[0]:  # attn_prefill over each head's copy: no scores held
            for h in range(Hkv):
                head = tuple(a[seg.slot, h] for a in codes), tuple(s[seg.slot, h] for s in scales)
                self.dequant(*head, kv, L)
                self.flash(q, qg, *kv, out, seg, row0, (h * gq, gq, 0))
            return
        ws = fr.mem_workspace
        budget = SCORE_BUDGET
        if ws is not None and ws.block is not None:
            budget = ws.nbytes - 4 * ALIGN - kv[0].nbytes - kv[1].nbytes
        tq = max(1, min(rows, budget // (gq * L * (4 + isz))))
        scores_all = fr.workspace.take((gq * tq * L,), cupy.float32)
        probs_all = fr.workspace.take((gq * tq * L,), kern.act_dtype)
        o = fr.take((Hq, rows, hd))
        qseg = q[row0:]  # [Hq, rows, hd] laid out from row0 * Hq * hd
        for h in range(Hkv):
            head = tuple(a[seg.slot, h] for a in codes), tuple(s[seg.slot, h] for s in scales)
            self.dequant(*head, kv, L)
            for t0 in range(0, rows, tq):
                n = min(tq, rows - t0)
                scores = scores_all[: gq * n * L].reshape(gq, n, L)  # this head's query heads
                probs = probs_all[: gq * n * L].reshape(gq, n, L)
                a_ptr = qseg.data.ptr + ((h * gq * rows + t0) * hd) * isz
                self._scores(a_ptr, kv[0].data.ptr, scores.data.ptr, n, L, gq, rows)
                self.softmax_causal(scores, probs, n, t0, seg.start, L)
                o_ptr = o.data.ptr + ((h * gq * rows + t0) * hd) * isz
                self._values(probs.data.ptr, kv[1].data.ptr, o_ptr, n, L, gq, rows)
        self.gate(o, qg, out, rows, row0, Hq, hd)
