"""Prefill attention of one segment on the CUDA backend: cuBLAS products around a causal
softmax kernel, in chunks of query rows sized to the workspace.

For each chunk of `tq` query rows and each KV head, one strided-batched GEMM forms the
scores of the `Hq / Hkv` query heads that share it (fp32, scaled by hd^-1/2), `softmax_causal`
turns them into probabilities in the activation type (zero past each row's last visible
key), a second GEMM multiplies them by V, and `attn_gate` applies the output gate.
"""

from __future__ import annotations

from typing import Any

from engine.backends.cuda.blas import matmul
from engine.memory.arena import ALIGN

SCORE_BUDGET = 512 << 20  # bytes of scores + probabilities per chunk without a workspace


def prefill_attention(be: Any, q, qg, kc, vc, seg, row0: int, out) -> None:
    """Attention of segment `seg` (rows from `row0` of the batch) into `out`; `q` holds the
    normalised, rotated queries as `[Hq, rows, hd]` per segment (see attention.cu)."""
    c, cp, ops = be.config, be.cp, be.ops
    Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    gq, rows, L = Hq // Hkv, seg.rows, seg.start + seg.rows
    t_act, t32 = ops.cuda_type, 0
    isz = ops.act_itemsize
    ws = be.mem_workspace
    budget = ws.nbytes - 2 * ALIGN if ws is not None and ws.block is not None else SCORE_BUDGET
    tq = max(1, min(rows, budget // (Hq * L * (4 + isz))))
    o = be.take((Hq, rows, hd))
    qseg = q[row0:]  # [Hq, rows, hd] laid out from row0 * Hq * hd
    for t0 in range(0, rows, tq):
        n = min(tq, rows - t0)
        be.workspace.begin("ws")
        scores = be.workspace.take((Hq, n, L), cp.float32)
        probs = be.workspace.take((Hq, n, L), ops.act_dtype)
        for h in range(Hkv):
            kbase = kc[seg.slot, h]  # [context, hd]
            a_ptr = qseg.data.ptr + ((h * gq * rows + t0) * hd) * isz
            matmul(
                a_ptr,
                t_act,
                hd,
                kbase.data.ptr,
                t_act,
                hd,
                True,
                scores[h * gq].data.ptr,
                t32,
                L,
                n,
                L,
                hd,
                alpha=hd**-0.5,
                batch=gq,
                stride_a=rows * hd,
                stride_b=0,
                stride_c=n * L,
            )
        ops.softmax_causal(scores, probs, n, t0, seg.start, L)
        for h in range(Hkv):
            vbase = vc[seg.slot, h]
            o_ptr = o.data.ptr + ((h * gq * rows + t0) * hd) * isz
            matmul(
                probs[h * gq].data.ptr,
                t_act,
                L,
                vbase.data.ptr,
                t_act,
                hd,
                False,
                o_ptr,
                t_act,
                hd,
                n,
                hd,
                L,
                batch=gq,
                stride_a=n * L,
                stride_b=0,
                stride_c=rows * hd,
            )
    ops.attn_gate(o, qg, out, rows, row0, Hq, hd)
