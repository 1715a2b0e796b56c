"""The Gated DeltaNet layer on the CUDA backend (gdn.cu, gdn_chunk.cu).

A decode step runs the causal conv, the gates, the l2 norms and the delta rule in one launch
(`gdn_step`, or `gdn_step_split` over a cluster of blocks a key head) where the head sizes
fit, and that launch brings the weights read next toward L2 while it leaves memory idle.
Elsewhere `gdn_prep` computes q, k, v and the gates (a step's prep also shifts the conv
state), a window's conv state is updated after every row has read it (`gdn_conv_state`),
and the delta rule runs token by token (`gdn_scan`) or, for a window, in chunks
(`gdn_chunk`, where the GPU's shared memory allows; `gdn_chunk_tc`, its products on TF32
tensor cores, where the model computes in bf16 or fp16 on sm_80 and newer: `chunk_kernel`).
The gated output norm runs as its own kernel (`gdn_out`) or, at decode sizes, as
out_proj's prologue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.base import Batch
from engine.backends.cuda.card import runs_cluster_split, runs_mma
from engine.backends.cuda.frame import Frame
from engine.backends.cuda.launch import (
    Kernels,
    ahead_spans,
    cdiv,
    compute_capability,
    smem_per_block,
)
from engine.backends.cuda.projections import Pro, Projections, Prologue
from engine.backends.cuda.state import StreamState
from engine.backends.cuda.tuning import Tuning

i32, f32 = np.int32, np.float32


STEP_MAX_TAPS = 4  # conv taps a decode step's one launch takes (STEP_MAXK in gdn.cu)
SCAN_COLUMNS = 4  # value columns a warp of the token-by-token delta rule (gdn_scan)
SCAN = f"gdn_scan<{SCAN_COLUMNS}>"
SCAN_KEEP = f"gdn_scan_keep<{SCAN_COLUMNS}>"  # a drafting verify: each row's state kept


def keep_step_kernel(
    Hk: int, Hv: int, dk: int, dv: int, K: int, blocks: int, capability: int
) -> tuple[str, int, int] | None:
    """(instance, blocks a key head, threads) of a drafting verify's one DeltaNet launch: the
    decode step's kernel (`step_kernel`) row after row, each row's state and conv inputs kept
    (`gdn_step_split_keep` over the step's cluster, or `gdn_step_keep`), or None where no
    step kernel applies (then gdn_prep, gdn_conv_state and gdn_scan_keep)."""
    step = step_kernel(Hk, Hv, dk, dv, K, blocks, capability)
    if step is None:
        return None
    sym, per_head, threads = step
    name, _, params = sym.partition("<")
    return f"{name}_keep<{params}", per_head, threads


def chunk_symbol(gc: int) -> str:
    return f"gdn_chunk<{gc}>"


def chunk_smem(gc: int) -> int:
    """Shared-memory bytes of gdn_chunk<gc> (the buffers listed at the top of gdn_chunk.cu)."""
    ldk, ldv, ldc = 129, 33, gc + 1
    return 4 * (2 * gc * ldk + 2 * gc * ldv + 2 * gc * ldc + 128 * ldv + 4 * gc)


def chunk_rows_for(smem_per_block: int) -> int:
    """Rows per chunk of `gdn_chunk`: the largest whose shared memory one block may take
    (64 on sm_90 and sm_80, 32 on the 99 KiB consumer cards, 16 on sm_75), 0 for none."""
    fits = [gc for gc in (64, 32, 16) if chunk_smem(gc) <= smem_per_block]
    return fits[0] if fits else 0


def chunk_tc_smem(gc: int) -> int:
    """Shared-memory bytes of gdn_chunk_tc<gc> (the buffers listed in gdn_chunk_tc.cu):
    131 KiB at 64 rows, 67.5 KiB at 32."""
    ldk, ldv, ldc = 132, 40, gc + 4
    return 4 * (2 * gc * ldk + gc * ldv + 2 * gc * ldc + 128 * ldv + 4 * gc)


TC_ROWS = 32  # rows per chunk of gdn_chunk_tc: 64 (131 KiB) ran 10% slower on the H200


def chunk_tc_rows(dtype: str, capability: int, smem_per_block: int) -> int:
    """Rows per chunk of `gdn_chunk_tc` (the chunk's products as TF32 mma, the state in
    fp32): `TC_ROWS`, whose 67.5 KiB fit every card from sm_80. 0 where `gdn_chunk` runs
    instead: fp32 compute, held to 1e-4 of the numpy reference, which TF32's 10-bit
    mantissa does not meet; cards before sm_80, which have no TF32 mma (`card.runs_mma`);
    a block given less shared memory."""
    if dtype == "float32" or not runs_mma(capability):
        return 0
    return TC_ROWS if chunk_tc_smem(TC_ROWS) <= smem_per_block else 0


@dataclass(frozen=True)
class ChunkKernel:
    """The chunked delta rule's launch: `symbol` of kernels/`file`, `rows` a chunk, `smem`
    bytes of dynamic shared memory; grid (Hv, dv / 32, segments) x 256 threads either way."""

    file: str
    symbol: str
    rows: int
    smem: int


def chunk_launch(tc_rows: int, simt_rows: int) -> ChunkKernel | None:
    """`gdn_chunk_tc` at `tc_rows` a chunk where that is nonzero, else `gdn_chunk` at
    `simt_rows`, else None (windows run `gdn_scan`)."""
    if tc_rows:
        return ChunkKernel(
            "gdn_chunk_tc.cu", f"gdn_chunk_tc<{tc_rows}>", tc_rows, chunk_tc_smem(tc_rows)
        )
    if simt_rows:
        return ChunkKernel(
            "gdn_chunk.cu", chunk_symbol(simt_rows), simt_rows, chunk_smem(simt_rows)
        )
    return None


def chunk_kernel(dtype: str, capability: int, smem_per_block: int) -> ChunkKernel | None:
    """The chunked delta rule for a model computing in `dtype` on this card (what
    `DeltaNet.chunk` launches and catalog.py lists)."""
    return chunk_launch(
        chunk_tc_rows(dtype, capability, smem_per_block), chunk_rows_for(smem_per_block)
    )


def step_shape(Hk: int, Hv: int, dk: int, dv: int) -> tuple[int, int] | None:
    """(columns per warp, threads) of `gdn_step` for these head sizes, or None where it
    does not apply (then a step runs gdn_prep and gdn_scan)."""
    if dk != 128 or Hv % Hk or Hv // Hk > 8:
        return None
    gv = Hv // Hk
    cols = gv * dv
    for nc in (4, 8):
        threads = cols // nc * 32
        if cols <= 256 and dv % nc == 0 and 2 * dk + cols + gv <= threads <= 1024:
            return nc, threads
    return None


def split_shape(
    Hk: int, Hv: int, dk: int, dv: int, blocks: int, capability: int
) -> tuple[int, int] | None:
    """(columns per warp, threads) of `gdn_step_split` over `blocks` blocks a key head (a
    thread block cluster: `card.runs_cluster_split`), or None where it does not apply (then
    one block takes a key head)."""
    P = blocks
    if not P or not step_shape(Hk, Hv, dk, dv) or not runs_cluster_split(capability):
        return None
    cols = Hv // Hk * dv
    if cols % P or dv % (cols // P):
        return None
    cb = cols // P
    for nc in (8, 4, 2, 1):
        threads = cb // nc * 32
        if cb % nc == 0 and 2 * dk + cb + 1 <= threads <= 1024:
            return nc, threads
    return None


def step_kernel(
    Hk: int, Hv: int, dk: int, dv: int, K: int, blocks: int, capability: int
) -> tuple[str, int, int] | None:
    """(instance, blocks a key head, threads) of a decode step's one DeltaNet launch:
    `gdn_step_split` where `split_shape` allows, else `gdn_step`; None where neither applies
    (then gdn_prep and gdn_scan)."""
    if K > STEP_MAX_TAPS or step_shape(Hk, Hv, dk, dv) is None:
        return None
    split = split_shape(Hk, Hv, dk, dv, blocks, capability)
    if split is not None:
        nc, threads = split
        return f"gdn_step_split<{nc},{blocks}>", blocks, threads
    nc, threads = step_shape(Hk, Hv, dk, dv)
    return f"gdn_step<{nc}>", 1, threads


class DeltaNet:
    """Owns gdn.cu, gdn_chunk.cu and gdn_chunk_tc.cu; reads and updates the conv and
    recurrent state of `state`, carves from `frame`, and runs out_proj with its prologue on
    `projections`."""

    def __init__(
        self,
        kernels: Kernels,
        frame: Frame,
        state: StreamState,
        projections: Projections,
        tuning: Tuning,
    ) -> None:
        self.k, self.frame, self.state = kernels, frame, state
        self.projections, self.tuning = projections, tuning
        self._chunk_rows: int | None = None  # gdn_chunk rows per chunk (0: not available)
        self._tc_rows: int | None = None  # gdn_chunk_tc rows per chunk (0: gdn_chunk runs)
        self.verify_rows: Any = None  # DeviceVerifyRows where the backend drafts

    # ----- the ops ------------------------------------------------------------------------
    def gated_delta(
        self, layer: int, mixed: Any, z: Any, b: Any, a: Any, weights: dict, batch: Batch
    ) -> Any:
        """`Backend.gated_delta`: the mixer's output [R, VD] before out_proj."""
        c = self.state.config
        o = self.core(layer, mixed, b, a, weights, batch)
        y = self.frame.take((mixed.shape[0], c.value_dim))
        Hv, dv = c.linear_num_value_heads, c.linear_value_head_dim
        self.out(o, z, weights["norm"], y, Hv, dv, c.rms_norm_eps)
        return y

    def gated_delta_out(
        self,
        layer: int,
        mixed: Any,
        z: Any,
        b: Any,
        a: Any,
        weights: dict,
        out_proj: Any,
        batch: Batch,
        ahead: tuple = (),
    ) -> Any:
        """`Backend.gated_delta_out` where the gated output norm can run inside out_proj's
        launch (its GATED_NORM prologue), else None (nothing done). A step's DeltaNet launch
        brings out_proj's weights and the heads of `ahead`'s toward L2."""
        c = self.state.config
        dv = c.linear_value_head_dim
        if not self.projections.pro_ok(z, out_proj, Prologue.GATED_NORM, head_dim=dv):
            return None
        o = self.core(layer, mixed, b, a, weights, batch, (out_proj, *ahead))
        out = self.frame.take((mixed.shape[0], out_proj.shape[0]))
        pro = Pro(Prologue.GATED_NORM, weights["norm"], c.rms_norm_eps, o=o, head_dim=dv)
        self.projections.gemv(z, out_proj, out, pro=pro)
        return out

    def core(
        self, layer: int, mixed: Any, b: Any, a: Any, weights: dict, batch: Batch, ahead=()
    ) -> Any:
        """Conv, gates and the delta-rule scan; returns the fp32 output `o` [R, VD] before
        its gated norm. A step (one row per stream) runs all of it in one `gdn_step` launch
        (which brings the weights read next, `ahead`, toward L2) where the head sizes allow,
        else the prep kernel updates the conv state itself; a window needs the separate pass
        after every row has read it. A drafting verify runs in one launch where a step kernel
        applies (`keep_step_kernel`: its rows as that many steps, each row's state and conv
        inputs kept), else keeps each row's state with gdn_scan_keep."""
        import cupy

        c, fr = self.state.config, self.frame
        R, S = mixed.shape[0], len(batch.segments)
        Hk, Hv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv, K = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim
        assert dk == 128 and dv % 4 == 0, "the DeltaNet kernels assume key head dim 128"
        f = cupy.float32
        step = batch.is_step
        segs = fr.segs(S)
        conv, recurrent = self.state.conv[layer], self.state.recurrent[layer]
        dims = (Hk, Hv, dk, dv, K)
        if step and K <= STEP_MAX_TAPS and self.step_shape(Hk, Hv, dk, dv):
            o = fr.take((R, Hv * dv), f)
            w = (weights["conv1d"], conv, a, b, weights["A_log"], weights["dt_bias"])
            self.step(mixed, *w, recurrent, segs, S, o, dims, ahead=ahead)
            return o
        keep = self.verify_rows if any(seg.keep for seg in batch.segments) else None
        P = self.tuning.deltanet_step_blocks
        kernel = keep_step_kernel(*dims, P, compute_capability()) if keep is not None else None
        if kernel is not None and all(seg.keep for seg in batch.segments):
            keep.record(batch)  # the launch writes the history itself
            sym, per_head, threads = kernel
            o = fr.take((R, Hv * dv), f)
            w = (weights["conv1d"], conv, a, b, weights["A_log"], weights["dt_bias"])
            args = (mixed, *w, recurrent, *segs, o, i32(Hk), i32(Hv), i32(dv), i32(K))
            kept = (keep.states[layer], i32(keep.tokens))
            hist = (keep.history[layer], i32(keep.history.shape[2]))
            self.k.run("gdn.cu", sym, (Hk * per_head, S), (threads,), args + kept + hist)
            return o
        outs = (
            fr.take((R, Hk * dk), f),
            fr.take((R, Hk * dk), f),
            fr.take((R, Hv * dv), f),
            fr.take((R, Hv), f),
            fr.take((R, Hv), f),
        )
        _, row_slot, row_tl, _ = fr.rows(R)
        w = (weights["conv1d"], conv, a, b, weights["A_log"], weights["dt_bias"])
        self.prep(mixed, *w, row_slot, row_tl, outs, dims, update_state=step)
        if keep is not None:  # a verify (Segment.keep): what rewinding it takes
            keep.save_history(layer, conv, mixed, batch)
        if not step:
            self.conv_state(mixed, conv, segs, S, c.conv_dim, K)
        o = fr.take((R, Hv * dv), f)
        q, k, v, g, beta = outs
        if keep is not None:
            kept = (keep.states[layer], i32(keep.tokens))
            self.scan(q, k, v, g, beta, recurrent, segs, S, o, Hk, Hv, dv, kept)
        elif step or not self.chunk(q, k, v, g, beta, recurrent, segs, S, o, Hk, Hv, dv):
            self.scan(q, k, v, g, beta, recurrent, segs, S, o, Hk, Hv, dv)
        return o

    # ----- kernels ------------------------------------------------------------------------
    def prep(
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
        """Conv, SiLU, l2 norms and gates into `outs` (q, k, v, g, beta); with
        `update_state` (a step) the conv state is shifted too."""
        Hk, Hv, dk, dv, K = dims
        R = mixed.shape[0]
        self.k.run(
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

    def step_shape(self, Hk: int, Hv: int, dk: int, dv: int) -> tuple[int, int] | None:
        """`step_shape` (module level) of these head sizes."""
        return step_shape(Hk, Hv, dk, dv)

    def split_shape(self, Hk: int, Hv: int, dk: int, dv: int) -> tuple[int, int] | None:
        """`split_shape` over `deltanet_step_blocks` blocks a key head on this GPU."""
        P = self.tuning.deltanet_step_blocks
        return split_shape(Hk, Hv, dk, dv, P, compute_capability())

    def step(
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
        """A decode step's conv, gates and delta rule in one launch (`gdn_step`, or
        `gdn_step_split` where `split_shape` allows); the caller has checked `step_shape`
        and a conv of at most 4 taps. `ahead`: the weights read next (out_proj, gate, up),
        which the launch brings toward L2 (launch.ahead_spans)."""
        Hk, Hv, dk, dv, K = dims
        P = self.tuning.deltanet_step_blocks
        sym, per_head, threads = step_kernel(Hk, Hv, dk, dv, K, P, compute_capability())
        self.k.run(
            "gdn.cu",
            sym,
            (Hk * per_head, n_segs),
            (threads,),
            (mixed, conv_w, cstate, a, b, A_log, dt_bias, state, *segs[:2], o)
            + (i32(Hk), i32(Hv), i32(dv), i32(K))
            + ahead_spans(ahead if self.k.prefetch else (), self.tuning),
        )

    def conv_state(self, mixed, cstate, segs, n_segs, C, K):
        """A window's conv state: each segment's last K-1 rows of `mixed`."""
        self.k.run(
            "gdn.cu",
            "gdn_conv_state",
            (cdiv(C, 256), n_segs),
            (256,),
            (mixed, cstate, *segs, i32(C), i32(K)),
        )

    def scan(self, q, k, v, g, beta, state, segs, n_segs, o, Hk, Hv, dv, kept=()):
        """The delta rule token by token; with `kept` (the layer's kept states and how many
        rows a slot keeps) each row's state is kept too (gdn_scan_keep)."""
        nc = SCAN_COLUMNS
        self.k.run(
            "gdn.cu",
            SCAN_KEEP if kept else SCAN,
            (Hv * dv // (nc * 4), n_segs),
            (128,),
            (q, k, v, g, beta, state, *segs, o, i32(Hk), i32(Hv), i32(dv), *kept),
        )

    def chunk_rows(self) -> int:
        """Rows per chunk of `gdn_chunk` on this GPU (`chunk_rows_for`)."""
        if self._chunk_rows is None:
            self._chunk_rows = chunk_rows_for(smem_per_block())
        return self._chunk_rows

    def tc_rows(self) -> int:
        """Rows per chunk of `gdn_chunk_tc` for this dtype and GPU (`chunk_tc_rows`)."""
        if self._tc_rows is None:
            cap = compute_capability()
            self._tc_rows = chunk_tc_rows(self.k.dtype, cap, smem_per_block())
        return self._tc_rows

    def chunk_kernel(self) -> ChunkKernel | None:
        """The chunked delta rule this backend launches (`chunk_kernel`)."""
        return chunk_launch(self.tc_rows(), self.chunk_rows())

    def chunk(self, q, k, v, g, beta, state, segs, n_segs, o, Hk, Hv, dv) -> bool:
        """The delta rule over windows in chunks (gdn_chunk.cu or gdn_chunk_tc.cu, on fp32
        q, k, v, g, beta whatever the compute dtype); False (nothing launched) where the
        GPU's shared memory or the head size does not allow it."""
        kern = self.chunk_kernel()
        if kern is None or dv % 32:
            return False
        fn = self.k.fn(kern.file, kern.symbol)
        self.k.allow_smem(fn, (kern.symbol,), kern.smem)
        args = (q, k, v, g, beta, state, *segs, o, i32(Hk), i32(Hv), i32(dv))
        self.k.launch(fn, (Hv, dv // 32, n_segs), (256,), args, kern.smem)
        return True

    def out(self, o, z, w, y, Hv, dv, eps):
        """The gated output norm: y = rms_norm per head(o) * w * silu(z)."""
        self.k.run(
            "gdn.cu", "gdn_out", (o.shape[0], Hv), (128,), (o, z, w, y, i32(Hv), i32(dv), f32(eps))
        )
