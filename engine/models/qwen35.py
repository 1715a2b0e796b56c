"""The Qwen3.5 dense text forward pass, written once against `engine.backends.base.Backend`.

Attribute and weight names follow the checkpoint (docs/architecture.md). Each decoder layer
is pre-norm: `h = x + mixer(norm1(x)); x' = h + mlp(norm2(h))`; the residual add is fused
with the next norm, so the loop carries `(u, x)` = (normed input, residual).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.base import Backend, Batch
from engine.config import FULL, ModelConfig


class Qwen35Model:
    """Binds a config, a backend and the uploaded weights; `forward` runs one batch."""

    def __init__(self, config: ModelConfig, backend: Backend, weights: dict[str, Any]):
        self.config = config
        self.backend = backend
        self.w = weights
        self.head = weights["embed_tokens"] if config.tie_word_embeddings else weights["lm_head"]
        # Index of each layer among its kind: KV caches and DeltaNet states are per kind.
        self.kind_index = {}
        for kind_layers in (config.full_layers, config.linear_layers):
            for j, i in enumerate(kind_layers):
                self.kind_index[i] = j

    def forward(self, batch: Batch, ids: np.ndarray, all_logits: bool = False) -> Any:
        """Run `batch` over token `ids` `[R]`; return logits `[S, V]` for each segment's last row
        (or `[R, V]` for every row with `all_logits`), and advance every stream's state."""
        c, be, w = self.config, self.backend, self.w
        eps = c.rms_norm_eps
        ids_dev = be.prepare(batch, ids)
        x = be.embedding(w["embed_tokens"], ids_dev)  # [R, H]
        u = be.rms_norm(x, w["layers.0.input_layernorm"], eps)
        for i, kind in enumerate(c.layer_types):
            be.begin_layer(i)
            p = f"layers.{i}."
            if kind == FULL:
                delta = self._attention(p + "self_attn.", self.kind_index[i], u, batch)
            else:
                delta = self._gated_delta(p + "linear_attn.", self.kind_index[i], u, batch)
            u, x = be.add_rms_norm(x, delta, w[p + "post_attention_layernorm"], eps)
            delta = be.mlp(u, w[p + "mlp.gate_proj"], w[p + "mlp.up_proj"], w[p + "mlp.down_proj"])
            last = i + 1 == c.num_hidden_layers
            next_norm = w["norm"] if last else w[f"layers.{i + 1}.input_layernorm"]
            u, x = be.add_rms_norm(x, delta, next_norm, eps)
        be.begin_head()
        if not all_logits:
            u = be.take_rows(u, batch.last_rows())  # [S, H]
        return be.linear(u, self.head)  # [S or R, V]

    def _attention(self, p: str, layer: int, u: Any, batch: Batch) -> Any:
        be, w = self.backend, self.w
        # qg [R, Hq*2*hd], k and v [R, Hkv*hd]
        qg, k, v = be.linear_many(u, [w[p + "q_proj"], w[p + "k_proj"], w[p + "v_proj"]])
        o = be.attention(layer, qg, k, v, w[p + "q_norm"], w[p + "k_norm"], batch)
        return be.linear(o, w[p + "o_proj"])  # [R, H]

    def _gated_delta(self, p: str, layer: int, u: Any, batch: Batch) -> Any:
        be, w = self.backend, self.w
        # mixed [R, C], z [R, VD], b and a [R, Hv]
        names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        mixed, z, b, a = be.linear_many(u, [w[p + n] for n in names])
        params = {name: w[p + name] for name in ("conv1d", "A_log", "dt_bias", "norm")}
        y = be.gated_delta(layer, mixed, z, b, a, params, batch)  # [R, VD]
        return be.linear(y, w[p + "out_proj"])  # [R, H]
