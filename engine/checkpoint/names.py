"""File keys -> Snug's internal tensor names, and the tensor set a config implies.

Internal names are module paths without the file's prefix and without `.weight`
(docs/architecture.md): `layers.3.self_attn.q_proj`, `norm`, `lm_head`, `mtp.fc`.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.model_config import FULL, LINEAR, ModelConfig

HF, MLX = "hf", "mlx"

# (file prefix, internal prefix or None to skip), first match wins; order matters because
# `model.` is a prefix of `model.visual.` and `model.language_model.`.
_PREFIXES: tuple[tuple[str, str | None], ...] = (
    ("model.visual.", None),  # HF vision tower
    ("vision_tower.", None),  # mlx-vlm keeps the vision tower under this name
    ("model.language_model.", ""),  # HF Qwen3_5ForConditionalGeneration
    ("language_model.model.", ""),  # MLX (mlx-lm / mlx-vlm conversions)
    ("language_model.lm_head.", "lm_head."),  # MLX untied head
    ("model.", ""),  # flat Qwen3_5ForCausalLM save (HF) or text-only mlx-lm save
    ("lm_head.", "lm_head."),  # HF untied head
    ("mtp.", "mtp."),  # HF multi-token-prediction head, kept under its own names
)

# Zero-centred RMSNorm weights: HF stores w and the model multiplies by (1 + w); MLX files
# already hold 1 + w. `linear_attn.norm` (the gated norm) is a plain multiplier in both.
_ZERO_CENTRED_SUFFIXES = (".input_layernorm", ".post_attention_layernorm", ".q_norm", ".k_norm")
_ZERO_CENTRED_NAMES = frozenset(
    {"norm", "mtp.norm", "mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden"}
)


def internal_name(key: str) -> str | None:
    """The internal name for a file key, or None for keys Snug does not use (vision tower).

    `.weight` is dropped; other leaves (`.scales`, `.biases`, `dt_bias`, `A_log`) stay.
    """
    for prefix, replacement in _PREFIXES:
        if key.startswith(prefix):
            if replacement is None:
                return None
            name = replacement + key[len(prefix) :]
            break
    else:
        return None
    return name.removesuffix(".weight")


def module_path(key: str) -> str:
    """The module path of a file key as the quantization config names it (no leaf)."""
    for leaf in (".weight", ".scales", ".biases"):
        if key.endswith(leaf):
            return key[: -len(leaf)]
    return key


def detect_format(shapes: Mapping[str, tuple[int, ...]], metadata: Mapping[str, str]) -> str:
    """'mlx' for mlx-lm / mlx-vlm output, else 'hf'.

    MLX files say `{"format": "mlx"}` in their metadata. When that was lost (a re-saved
    file), the key prefix, quantization scales or the conv1d layout [C, K, 1] tell.
    """
    if metadata.get("format") == MLX:
        return MLX
    for key, shape in shapes.items():
        if key.startswith("language_model.") or key.endswith(".scales"):
            return MLX
        if key.endswith("conv1d.weight") and len(shape) == 3 and shape[2] == 1 < shape[1]:
            return MLX
    return HF


def is_zero_centred(name: str) -> bool:
    """True for norms whose HF weight is stored as w and applied as (1 + w)."""
    return name in _ZERO_CENTRED_NAMES or name.endswith(_ZERO_CENTRED_SUFFIXES)


def is_conv(name: str) -> bool:
    return name.endswith(".linear_attn.conv1d")


def expected_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, with its logical shape (conv1d as [C, K])."""
    H, V, inter = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    hd, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    C, VD, K = cfg.conv_dim, cfg.value_dim, cfg.linear_conv_kernel_dim
    out: dict[str, tuple[int, ...]] = {"embed_tokens": (V, H), "norm": (H,)}
    if not cfg.tie_word_embeddings:
        out["lm_head"] = (V, H)
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        out[p + "input_layernorm"] = (H,)
        out[p + "post_attention_layernorm"] = (H,)
        out[p + "mlp.gate_proj"] = (inter, H)
        out[p + "mlp.up_proj"] = (inter, H)
        out[p + "mlp.down_proj"] = (H, inter)
        if kind == FULL:
            a = p + "self_attn."
            out[a + "q_proj"] = (2 * hq * hd, H)  # query and output gate, interleaved per head
            out[a + "k_proj"] = (hkv * hd, H)
            out[a + "v_proj"] = (hkv * hd, H)
            out[a + "o_proj"] = (H, hq * hd)
            out[a + "q_norm"] = (hd,)
            out[a + "k_norm"] = (hd,)
        elif kind == LINEAR:
            a = p + "linear_attn."
            out[a + "in_proj_qkv"] = (C, H)
            out[a + "in_proj_z"] = (VD, H)
            out[a + "in_proj_a"] = (hv, H)
            out[a + "in_proj_b"] = (hv, H)
            out[a + "conv1d"] = (C, K)
            out[a + "dt_bias"] = (hv,)
            out[a + "A_log"] = (hv,)
            out[a + "norm"] = (dv,)
            out[a + "out_proj"] = (H, VD)
    return out


MTP_LAYER = "mtp.layers.0."  # the one layer of Qwen3.5's MTP head (mtp_num_hidden_layers 1)


def expected_mtp_tensors(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The multi-token-prediction head's 15 tensors, as vLLM's Qwen3.5 MTP loader names
    them: `fc` [H, 2H] over the concatenation [embedding, hidden] (embedding first), the
    zero-centred norms `pre_fc_norm_embedding`, `pre_fc_norm_hidden` and `norm`, and one
    full-attention decoder layer. It shares the model's embedding table and LM head."""
    H, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    out: dict[str, tuple[int, ...]] = {"mtp.fc": (H, 2 * H)}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{n}"] = (H,)
    p, a = MTP_LAYER, MTP_LAYER + "self_attn."
    out[p + "input_layernorm"] = (H,)
    out[p + "post_attention_layernorm"] = (H,)
    out[a + "q_proj"] = (2 * hq * hd, H)
    out[a + "k_proj"] = (hkv * hd, H)
    out[a + "v_proj"] = (hkv * hd, H)
    out[a + "o_proj"] = (H, hq * hd)
    out[a + "q_norm"] = (hd,)
    out[a + "k_norm"] = (hd,)
    out[p + "mlp.gate_proj"] = (inter, H)
    out[p + "mlp.up_proj"] = (inter, H)
    out[p + "mlp.down_proj"] = (H, inter)
    return out


def conv_logical_shape(stored: tuple[int, ...], fmt: str) -> tuple[int, ...]:
    """[C, K] from HF's [C, 1, K] or MLX's [C, K, 1]; any other shape is returned as is
    so that the shape check reports what the file really holds."""
    if len(stored) == 3:
        if fmt == HF and stored[1] == 1:
            return (stored[0], stored[2])
        if fmt == MLX and stored[2] == 1:
            return (stored[0], stored[1])
    return stored


def stored_conv_layout(fmt: str) -> str:
    return "[C, 1, K]" if fmt == HF else "[C, K, 1]"
