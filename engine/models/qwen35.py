"""The Qwen3.5 dense text forward pass, written once against `engine.backends.base.Backend`.

Attribute and weight names follow the checkpoint (docs/architecture.md). Each decoder layer
is pre-norm: `h = x + mixer(norm1(x)); x' = h + mlp(norm2(h))`. A block's residual add is
deferred to the next block's norm, which runs in the same backend call as the projections
that read it (`norm_linear_many`, `norm_mlp`), so the loop carries `(x, delta)` = (residual
so far, what the last block adds to it) and a backend can fuse add, norm and projection.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.base import Backend, Batch
from engine.model_config import FULL, ModelConfig


class Qwen35Model:
    """Binds a config, a backend and the uploaded weights; `forward` runs one batch."""

    def __init__(self, config: ModelConfig, backend: Backend, weights: dict[str, Any]):
        self.config = config
        self.backend = backend
        self.w = weights
        self.head = weights["embed_tokens"] if config.tie_word_embeddings else weights["lm_head"]
        self.hidden: Any = None  # every row's final hidden state, from forward(hidden=True)
        # Index of each layer among its kind: KV caches and DeltaNet states are per kind.
        self.kind_index = {}
        for kind_layers in (config.full_layers, config.linear_layers):
            for j, i in enumerate(kind_layers):
                self.kind_index[i] = j

    def forward(
        self, batch: Batch, ids: np.ndarray, all_logits: bool = False, hidden: bool = False
    ) -> Any:
        """Run `batch` over token `ids` `[R]`; return logits `[S, V]` for each segment's last row
        (or `[R, V]` for every row with `all_logits`), and advance every stream's state.
        `hidden`: also keep every row's final hidden state, after the final norm, in
        `self.hidden` `[R, H]` (what the MTP head drafts from: engine/models/mtp.py)."""
        c, be, w = self.config, self.backend, self.w
        eps = c.rms_norm_eps
        ids_dev = be.prepare(batch, ids)
        x = be.embedding(w["embed_tokens"], ids_dev)  # [R, H]
        delta = None
        for i, kind in enumerate(c.layer_types):
            be.begin_layer(i)
            p = f"layers.{i}."
            norm, j = w[p + "input_layernorm"], self.kind_index[i]
            if kind == FULL:
                delta, x = self._attention(p + "self_attn.", j, x, delta, norm, batch)
            else:
                delta, x = self._gated_delta(p + "linear_attn.", j, x, delta, norm, batch)
            mlp = [w[p + "mlp." + n] for n in ("gate_proj", "up_proj", "down_proj")]
            delta, x = be.norm_mlp(x, delta, w[p + "post_attention_layernorm"], eps, *mlp)
        be.begin_head()
        if hidden:
            u, _ = be.add_rms_norm(x, delta, w["norm"], eps)  # [R, H]
            self.hidden = u
            if not all_logits:
                u = be.take_rows(u, batch.last_rows())
            return be.linear(u, self.head)
        if not all_logits:
            last = batch.last_rows()
            x, delta = be.take_rows(x, last), be.take_rows(delta, last)  # [S, H]
        (logits,), _ = be.norm_linear_many(x, delta, w["norm"], eps, [self.head])
        return logits  # [S or R, V]

    def _attention(self, p: str, layer: int, x: Any, delta: Any, norm: Any, batch: Batch):
        be, w = self.backend, self.w
        eps = self.config.rms_norm_eps
        # qg [R, Hq*2*hd], k and v [R, Hkv*hd]
        projections = [w[p + "q_proj"], w[p + "k_proj"], w[p + "v_proj"]]
        (qg, k, v), x = be.norm_linear_many(x, delta, norm, eps, projections)
        mlp = p.replace("self_attn.", "mlp.")
        ahead = (w[p + "o_proj"], w[mlp + "gate_proj"], w[mlp + "up_proj"])  # read after it
        o = be.attention(layer, qg, k, v, w[p + "q_norm"], w[p + "k_norm"], batch, ahead)
        return be.linear(o, w[p + "o_proj"]), x  # [R, H] each

    def _gated_delta(self, p: str, layer: int, x: Any, delta: Any, norm: Any, batch: Batch):
        be, w = self.backend, self.w
        eps = self.config.rms_norm_eps
        # mixed [R, C], z [R, VD], b and a [R, Hv]
        names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        (mixed, z, b, a), x = be.norm_linear_many(x, delta, norm, eps, [w[p + n] for n in names])
        params = {name: w[p + name] for name in ("conv1d", "A_log", "dt_bias", "norm")}
        mlp = p.replace("linear_attn.", "mlp.")
        ahead = (w[mlp + "gate_proj"], w[mlp + "up_proj"])  # read after out_proj
        out = be.gated_delta_out(layer, mixed, z, b, a, params, w[p + "out_proj"], batch, ahead)
        return out, x  # [R, H] each
