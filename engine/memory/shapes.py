"""Model shapes without files: the Qwen3.5 sizes and what their tensors weigh when stored.

`shape_tensor_specs(config, fmt)` gives internal name -> TensorSpec (shape, quantization),
the same mapping `engine.memory.arena.checkpoint_specs` reads from a checkpoint's headers, so
a model that is not downloaded is planned with the bytes its download would be planned with
(`snug plan --shape 4B --format mlx4`). `shape_tensor_nbytes` gives what its files weigh.
"""

from __future__ import annotations

import math

from engine.checkpoint.names import expected_mtp_tensors, expected_tensors
from engine.memory.arena import TensorSpec
from engine.model_config import FULL, LINEAR, ModelConfig, QuantConfig, QuantSpec

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


def layer_linear_shapes(config: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, out_features, in_features) of every projection in the decoder layers."""
    return [
        (name, shape[0], shape[1])
        for name, shape in expected_tensors(config).items()
        if name.startswith("layers.") and len(shape) == 2 and not name.endswith("conv1d")
    ]


def _stored_shapes(config: ModelConfig, fmt: str) -> dict[str, tuple[int, ...]]:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    shapes = dict(expected_tensors(config))
    if fmt == "bf16" and config.mtp_num_hidden_layers:
        shapes.update(expected_mtp_tensors(config))  # MLX conversions drop mtp.*
    return shapes


def _quantized(name: str, shape: tuple[int, ...], fmt: str, group_size: int) -> bool:
    """mlx4 quantizes every matrix whose width the group divides (not conv1d)."""
    return (
        fmt == "mlx4"
        and len(shape) == 2
        and not name.endswith("conv1d")
        and shape[1] % group_size == 0
    )


def shape_tensor_specs(
    config: ModelConfig, fmt: str = "mlx4", group_size: int = 64
) -> dict[str, TensorSpec]:
    """Internal name -> TensorSpec for a checkpoint of this shape and format, as
    `engine.memory.arena.checkpoint_specs` reads it from the published files."""
    quant = QuantSpec(4, group_size)
    return {
        name: TensorSpec(shape, quant if _quantized(name, shape, fmt, group_size) else None)
        for name, shape in _stored_shapes(config, fmt).items()
    }


def shape_tensor_nbytes(
    config: ModelConfig, fmt: str = "mlx4", group_size: int = 64
) -> dict[str, int]:
    """Stored bytes per internal tensor name for a checkpoint of this shape.

    mlx4: every matrix (the embedding and an untied head too) as 4-bit codes plus bf16 scales
    and biases per group; conv1d, norms and dt_bias bf16, A_log fp32; no MTP (mlx drops it).
    bf16: everything bf16 except A_log and the gated norm (fp32), MTP included.
    """
    sizes: dict[str, int] = {}
    for name, shape in _stored_shapes(config, fmt).items():
        n = math.prod(shape)
        if name.endswith("A_log") or (fmt == "bf16" and name.endswith("linear_attn.norm")):
            sizes[name] = n * 4  # stored in fp32
        elif _quantized(name, shape, fmt, group_size):
            out, inp = shape
            sizes[name] = n // 2 + 2 * (out * (inp // group_size) * 2)
        else:
            sizes[name] = n * 2
    return sizes
