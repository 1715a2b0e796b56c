"""The DeltaNet layer's steps on the CUDA backend: conv, gates and the delta-rule scan
(`gdn_step` for a decode step where the head sizes fit one launch, else `gdn_prep` then
`gdn_scan` or, for a prompt, `gdn_chunk`), and the gated output norm, which at decode sizes
runs as out_proj's prologue."""

from __future__ import annotations

from typing import Any

from engine.backends.base import Batch
from engine.backends.cuda.gemv import Pro


class DeltaNetMixin:
    """Mixed into CudaBackend (before `Backend`, whose `gated_delta_out` it falls back to);
    uses its `config`, `cp`, `ops`, `conv`, `recurrent`, `take`, `_segs` and `_meta_rows`."""

    def gated_delta(
        self, layer: int, mixed: Any, z: Any, b: Any, a: Any, weights: dict, batch: Batch
    ) -> Any:
        c = self.config
        o = self._gated_delta_core(layer, mixed, b, a, weights, batch)
        y = self.take((mixed.shape[0], c.value_dim))
        Hv, dv = c.linear_num_value_heads, c.linear_value_head_dim
        self.ops.gdn_out(o, z, weights["norm"], y, Hv, dv, c.rms_norm_eps)
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
        """At decode sizes the gated output norm runs inside out_proj's launch (`Pro` 2), and
        a step's DeltaNet launch brings out_proj's weights and the heads of `ahead`'s toward
        L2 (`Ops.l2_ahead`)."""
        c = self.config
        dv = c.linear_value_head_dim
        if not self.ops.pro_ok(z, out_proj, 2, head_dim=dv):
            return super().gated_delta_out(layer, mixed, z, b, a, weights, out_proj, batch)
        o = self._gated_delta_core(layer, mixed, b, a, weights, batch, (out_proj, *ahead))
        out = self.take((mixed.shape[0], out_proj.shape[0]))
        pro = Pro(2, weights["norm"], c.rms_norm_eps, o=o, head_dim=dv)
        self.ops.gemv(z, out_proj, out, pro=pro)
        return out

    def _gated_delta_core(
        self, layer: int, mixed: Any, b: Any, a: Any, weights: dict, batch: Batch, ahead=()
    ) -> Any:
        """Conv, gates and the delta-rule scan; returns the fp32 output `o` [R, VD] before
        its gated norm. A step (one row per stream) runs all of it in one `gdn_step` launch
        (which brings the weights read next, `ahead`, toward L2) where the head sizes allow, else
        the prep kernel updates the conv state itself; a window needs the separate pass after
        every row has read it."""
        c, cp, ops = self.config, self.cp, self.ops
        R, S = mixed.shape[0], len(batch.segments)
        Hk, Hv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv, K = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim
        assert dk == 128 and dv % 4 == 0, "the DeltaNet kernels assume key head dim 128"
        f = cp.float32
        step = batch.is_step
        segs = self._segs(S)
        if step and K <= 4 and ops.gdn_step_shape(Hk, Hv, dk, dv):
            o = self.take((R, Hv * dv), f)
            ops.gdn_step(
                mixed,
                weights["conv1d"],
                self.conv[layer],
                a,
                b,
                weights["A_log"],
                weights["dt_bias"],
                self.recurrent[layer],
                segs,
                S,
                o,
                (Hk, Hv, dk, dv, K),
                ahead=ahead,
            )
            return o
        outs = (
            self.take((R, Hk * dk), f),
            self.take((R, Hk * dk), f),
            self.take((R, Hv * dv), f),
            self.take((R, Hv), f),
            self.take((R, Hv), f),
        )
        _, row_slot, row_tl, _ = self._meta_rows(R)
        cstate = self.conv[layer]
        ops.gdn_prep(
            mixed,
            weights["conv1d"],
            cstate,
            a,
            b,
            weights["A_log"],
            weights["dt_bias"],
            row_slot,
            row_tl,
            outs,
            (Hk, Hv, dk, dv, K),
            update_state=step,
        )
        if not step:
            ops.gdn_conv_state(mixed, cstate, segs, S, c.conv_dim, K)
        o = self.take((R, Hv * dv), f)
        q, k, v, g, beta = outs
        state = self.recurrent[layer]
        chunked = not step and ops.chunked_prefill
        if not (chunked and ops.gdn_chunk(q, k, v, g, beta, state, segs, S, o, Hk, Hv, dv)):
            ops.gdn_scan(q, k, v, g, beta, state, segs, S, o, Hk, Hv, dv)
        return o
