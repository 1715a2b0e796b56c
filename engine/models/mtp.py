"""Qwen3.5's multi-token-prediction head, written against `engine.backends.base.Backend`.

The head (tensors `mtp.*`, engine.checkpoint.names.expected_mtp_tensors) drafts the token
after next. For a row at position p it takes the main model's final hidden state h_p
(after the final norm) and the embedding of the token that follows p, x_{p+1}:

    c  = [rms_norm(E[x_{p+1}]) * pre_fc_norm_embedding | rms_norm(h_p) * pre_fc_norm_hidden]
    u  = c @ fc.T                               [2H] -> [H]  (embedding first, as vLLM loads it)
    u' = one full-attention decoder layer (mtp.layers.0), RoPE at position p, own KV cache
    ĥ  = rms_norm(u') * norm;  logits = ĥ @ head.T   (the model's LM head)

so the logits at row p predict x_{p+2}. Every norm is zero-centred (1 + w, applied by the
checkpoint reader). Chained drafts feed ĥ back as the hidden state with the drafted token,
one position on. The head's KV cache is the backend's KV layer len(config.full_layers)
(`Backend.draft_tokens`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.base import Batch
from engine.checkpoint.names import MTP_LAYER
from engine.models.qwen35 import Qwen35Model


class MtpHead:
    """The MTP head over a loaded model's backend and weights (the `mtp.*` ones loaded)."""

    def __init__(self, model: Qwen35Model) -> None:
        self.model = model
        self.config, self.backend, self.w = model.config, model.backend, model.w
        missing = [n for n in ("mtp.fc", "mtp.norm") if n not in self.w]
        if missing:
            raise ValueError(f"the MTP head's weights were not loaded ({', '.join(missing)})")
        self.layer = len(self.config.full_layers)  # its KV layer, after the model's own
        self.hidden: Any = None  # ĥ of every row of the last forward [R, H]

    def forward(
        self, batch: Batch, ids: np.ndarray, hidden: Any, logits_rows: np.ndarray | None
    ) -> Any:
        """Run the head over `batch` (positions p): `ids` [R] the token after each row's
        position, `hidden` [R, H] each row's final hidden state (the main model's, or this
        head's own ĥ when chaining). Writes the head's KV at those positions, keeps ĥ in
        `self.hidden` and returns the logits of `logits_rows` (None: no LM head run)."""
        c, be, w = self.config, self.backend, self.w
        eps = c.rms_norm_eps
        ids_dev = be.prepare(batch, ids)
        e = be.embedding(w["embed_tokens"], ids_dev)  # [R, H]
        e = be.rms_norm(e, w["mtp.pre_fc_norm_embedding"], eps)
        h = be.rms_norm(hidden, w["mtp.pre_fc_norm_hidden"], eps)
        x = be.linear(be.concat_cols(e, h), w["mtp.fc"])  # [R, H]
        be.begin_layer(0)
        p, a = MTP_LAYER, MTP_LAYER + "self_attn."
        projections = [w[a + "q_proj"], w[a + "k_proj"], w[a + "v_proj"]]
        (qg, k, v), x = be.norm_linear_many(x, None, w[p + "input_layernorm"], eps, projections)
        o = be.attention(self.layer, qg, k, v, w[a + "q_norm"], w[a + "k_norm"], batch)
        delta = be.linear(o, w[a + "o_proj"])
        mlp = [w[p + "mlp." + n] for n in ("gate_proj", "up_proj", "down_proj")]
        delta, x = be.norm_mlp(x, delta, w[p + "post_attention_layernorm"], eps, *mlp)
        be.begin_head()
        u, _ = be.add_rms_norm(x, delta, w["mtp.norm"], eps)  # ĥ [R, H]
        self.hidden = u
        if logits_rows is None:
            return None
        return be.linear(be.take_rows(u, logits_rows), self.model.head)
