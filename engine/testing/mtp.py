"""The MTP head's tensors for random test checkpoints, in the layouts published files have.

Hugging Face (`Qwen/Qwen3.5-*`): 15 tensors at the top level of the safetensors files,
`mtp.fc.weight`, `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`,
`mtp.norm.weight` and `mtp.layers.0.*` (a full-attention decoder layer), beside the
`model.language_model.*` weights; bf16, with the zero-centred norms stored as w (applied as
1 + w). vLLM's Qwen3.5 MTP loader renames `mtp.` to its `model.` and concatenates
[embedding, hidden] before `fc`, both normed first (engine/models/mtp.py).

MLX (`mlx-community/*-MLX-4bit`): none. mlx-lm's `sanitize` for qwen3_5 drops every key
holding "mtp." before converting (and so does mlx-vlm), so the MLX builders here write none
and such a checkpoint reports drafting unavailable (engine.memory.draft).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.checkpoint.names import expected_mtp_tensors, is_zero_centred

MLX_KEEPS_MTP = False  # what mlx-lm's and mlx-vlm's conversions do (module docstring)
OUT_GAIN = 0.7  # projections back into the residual stream, as the tiny builder's


def hf_key(name: str) -> str:
    """The file key of an internal `mtp.*` name in a Hugging Face checkpoint."""
    return name + ".weight"


def sanitize_like_mlx(keys: list[str]) -> list[str]:
    """The keys an mlx-lm conversion keeps of `keys` (it drops "mtp." ones)."""
    return [k for k in keys if "mtp." not in k]


def random_mtp(config: Any, seed: int, std: float | None = None) -> dict[str, np.ndarray]:
    """Random float32 values for every `mtp.*` tensor of `config` (anything with the
    ModelConfig shape fields), by internal name, as a Hugging Face file holds them: norms
    as zero-centred w (0.1 * N(0, 1)), matrices N(0, std^2), or with `std` None scaled by
    1/sqrt(in) (0.7/sqrt(in) for o_proj and down_proj)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_mtp_tensors(config).items():
        if len(shape) == 1:
            assert is_zero_centred(name), name
            out[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
            continue
        scale = std
        if scale is None:
            gain = OUT_GAIN if name.endswith(("o_proj", "down_proj")) else 1.0
            scale = gain / np.sqrt(shape[1])
        out[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return out
