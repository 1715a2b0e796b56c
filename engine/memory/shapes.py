"""Model shapes without files: the Qwen3.5 sizes and what their tensors weigh when stored.

`shape_tensor_nbytes(config, fmt)` gives internal name -> stored bytes, the same mapping a
checkpoint's `tensors[name].nbytes` gives, so a plan can be made for a model not downloaded
(`snug plan --shape 4B --format mlx4`). Real shapes: shared spec, section 1.
"""

from __future__ import annotations

from engine.config import FULL, LINEAR, ModelConfig, QuantConfig, QuantSpec

FORMATS = ("mlx4", "bf16")

# name: (H, L, Hq, Hkv, Hv, I, tied)
_SIZES = {
    "0.8B": (1024, 24, 8, 2, 16, 3584, True),
    "2B": (2048, 24, 8, 2, 16, 6144, True),
    "4B": (2560, 32, 16, 4, 32, 9216, True),
    "9B": (4096, 32, 16, 4, 32, 12288, False),
}
SHAPES = tuple(_SIZES)


def shape_config(name: str, fmt: str = "bf16", group_size: int = 64) -> ModelConfig:
    """The ModelConfig of a Qwen3.5 size ("0.8B", "2B", "4B", "9B") in a storage format."""
    if name not in _SIZES:
        raise ValueError(f"unknown shape {name!r}; choose one of {', '.join(SHAPES)}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    H, L, Hq, Hkv, Hv, I, tied = _SIZES[name]
    quant = QuantConfig(QuantSpec(4, group_size)) if fmt == "mlx4" else None
    return ModelConfig(
        hidden_size=H,
        num_hidden_layers=L,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(L)),
        num_attention_heads=Hq,
        num_key_value_heads=Hkv,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=Hv,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        intermediate_size=I,
        vocab_size=248320,
        tie_word_embeddings=tied,
        mtp_num_hidden_layers=1,
        quantization=quant,
        source=f"Qwen3.5-{name} ({fmt})",
    )


def _full_attn_linears(c: ModelConfig) -> list[tuple[str, int, int]]:
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return [
        ("self_attn.q_proj", 2 * q, c.hidden_size),
        ("self_attn.k_proj", kv, c.hidden_size),
        ("self_attn.v_proj", kv, c.hidden_size),
        ("self_attn.o_proj", c.hidden_size, q),
    ]


def _mlp_linears(c: ModelConfig) -> list[tuple[str, int, int]]:
    H, I = c.hidden_size, c.intermediate_size
    return [("mlp.gate_proj", I, H), ("mlp.up_proj", I, H), ("mlp.down_proj", H, I)]


def layer_linear_shapes(config: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of every projection in the decoder layers."""
    c = config
    out: list[tuple[str, int, int]] = []
    for i, kind in enumerate(c.layer_types):
        if kind == FULL:
            mixer = _full_attn_linears(c)
        else:
            Hv, H = c.linear_num_value_heads, c.hidden_size
            mixer = [
                ("linear_attn.in_proj_qkv", c.conv_dim, H),
                ("linear_attn.in_proj_z", c.value_dim, H),
                ("linear_attn.in_proj_a", Hv, H),
                ("linear_attn.in_proj_b", Hv, H),
                ("linear_attn.out_proj", H, c.value_dim),
            ]
        out += [(f"layers.{i}.{n}", o, k) for n, o, k in mixer + _mlp_linears(c)]
    return out


def shape_tensor_nbytes(
    config: ModelConfig, fmt: str = "mlx4", group_size: int = 64
) -> dict[str, int]:
    """Stored bytes per internal tensor name for a checkpoint of this shape.

    mlx4: every linear and the embedding (and an untied head) as 4-bit codes plus bf16 scales
    and biases per group; norms, conv1d and dt_bias bf16, A_log fp32; no MTP (mlx drops it).
    bf16: everything bf16 except A_log and the gated norm (fp32), MTP included.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    c, H = config, config.hidden_size

    def linear(out: int, inp: int) -> int:
        if fmt == "bf16" or inp % group_size:
            return out * inp * 2
        return out * inp // 2 + 2 * (out * (inp // group_size) * 2)

    sizes: dict[str, int] = {"embed_tokens": linear(c.vocab_size, H), "norm": H * 2}
    if not c.tie_word_embeddings:
        sizes["lm_head"] = linear(c.vocab_size, H)
    for name, out, inp in layer_linear_shapes(c):
        sizes[name] = linear(out, inp)
    gated_norm = 4 if fmt == "bf16" else 2
    for i, kind in enumerate(c.layer_types):
        sizes[f"layers.{i}.input_layernorm"] = H * 2
        sizes[f"layers.{i}.post_attention_layernorm"] = H * 2
        if kind == FULL:
            sizes[f"layers.{i}.self_attn.q_norm"] = c.head_dim * 2
            sizes[f"layers.{i}.self_attn.k_norm"] = c.head_dim * 2
        else:
            p, Hv = f"layers.{i}.linear_attn", c.linear_num_value_heads
            sizes[f"{p}.conv1d"] = c.conv_dim * c.linear_conv_kernel_dim * 2
            sizes[f"{p}.dt_bias"] = Hv * 2
            sizes[f"{p}.A_log"] = Hv * 4
            sizes[f"{p}.norm"] = c.linear_value_head_dim * gated_norm
    if fmt == "bf16" and c.mtp_num_hidden_layers:
        sizes["mtp.fc"] = H * 2 * H * 2
        for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            sizes[f"mtp.{n}"] = H * 2
        for n, out, inp in _full_attn_linears(c) + _mlp_linears(c):
            sizes[f"mtp.layers.0.{n}"] = out * inp * 2
    return sizes
