"""Tiny checkpoints in the shapes model publishers ship, for tests of the real thing.

`engine.testing.tiny` writes what transformers and mlx-lm produce. The folders people
download differ from those in ways a loader has to survive:

- `config.json` carries the publisher's whole key set: nested `text_config` and
  `vision_config`, `mtp_num_hidden_layers`, token ids of the vision markers, converter
  stamps (`unsloth_fixed`, `transformers_version`), `rope_parameters` with `type` or
  `rope_type`, an MLX conversion's `quantization` and `quantization_config` blocks.
- The weights are sharded behind `model.safetensors.index.json`, with Qwen's shard names
  (`model.safetensors-00001-of-00002.safetensors`) or transformers' (`model-00001-of-...`).
- HF checkpoints hold the vision tower (`model.visual.*`) and the MTP head (`mtp.*`), or
  not; an mlx-vlm conversion keeps the vision tower unquantized as `vision_tower.*`.

`shaped_config` puts a tiny model's dimensions into a published config.json (the copies in
tests/fixtures/published/), so every other key is the publisher's. `build_published_hf` and
`build_published_mlx` write the weights around it. torch, transformers, mlx and mlx-lm are
imported inside functions, as in `engine.testing.tiny`.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.testing.tiny import VISION_CONFIG, TinySpec, build_hf, build_mlx, special_token_ids

INDEX = "model.safetensors.index.json"
# Shard names: Qwen's repos and transformers' save_pretrained.
SHARD_NAMES = {
    "qwen": "model.safetensors-{i:05d}-of-{n:05d}.safetensors",
    "hf": "model-{i:05d}-of-{n:05d}.safetensors",
}
# text_config keys that describe the model's shape; every other key keeps the published value.
_TEXT_SHAPE = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "intermediate_size",
    "vocab_size",
    "full_attention_interval",
)


def shaped_config(
    published: Mapping[str, Any], spec: TinySpec, quantization: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A copy of a published config.json with `spec`'s dimensions and the tiny tokenizer's
    ids in place of the real ones; every other key and value is kept as published.

    `quantization` replaces the `quantization` / `quantization_config` blocks a published MLX
    config has (and adds them when it has none); None keeps or omits them as published.
    """
    config = copy.deepcopy(dict(published))
    text = config.setdefault("text_config", {}) if config.get("model_type") == "qwen3_5" else config
    shape = spec.text_config(eos_token_id=0)
    for key in _TEXT_SHAPE:
        text[key] = shape[key]
    text["layer_types"] = spec.layer_types
    text["max_position_embeddings"] = shape["max_position_embeddings"]
    rope = text.get("rope_parameters")
    if isinstance(rope, dict) and "mrope_section" in rope:
        rope["mrope_section"] = shape["rope_parameters"]["mrope_section"]
    text["tie_word_embeddings"] = spec.tie_word_embeddings
    if "tie_word_embeddings" in config:
        config["tie_word_embeddings"] = spec.tie_word_embeddings
    ids = special_token_ids()
    text["eos_token_id"] = ids["<|endoftext|>"]  # Qwen: the config's eos is <|endoftext|>
    if "eos_token_id" in config and config is not text:
        config["eos_token_id"] = ids["<|im_end|>"]  # an MLX conversion's top level: <|im_end|>
    for key in ("pad_token_id", "bos_token_id"):
        for where in (config, text):
            if where.get(key) is not None:
                where[key] = ids["<|endoftext|>"]
    if isinstance(config.get("vision_config"), dict):
        vision = config["vision_config"]
        vision.update(VISION_CONFIG, out_hidden_size=spec.hidden_size)
    if quantization is not None:
        for key in ("quantization", "quantization_config"):
            config[key] = dict(quantization)
    return config


def write_sharded(
    tensors: Mapping[str, Any],
    out_dir: Path,
    shards: int,
    names: str = "qwen",
    metadata: Mapping[str, str] | None = None,
    save: Any = None,
) -> dict[str, str]:
    """Split `tensors` (name -> array, in order) into `shards` files named as `names` says
    and write the index as the publishers do (sorted weight_map, total_size and
    total_parameters). `save(arrays, path, metadata)` writes one file. Returns weight_map."""
    if shards < 1 or names not in SHARD_NAMES:
        raise ValueError(f"shards must be >= 1 and names one of {', '.join(SHARD_NAMES)}")
    keys = list(tensors)
    per = math.ceil(len(keys) / shards)
    weight_map: dict[str, str] = {}
    total_size = total_params = 0
    for i in range(shards):
        part = keys[i * per : (i + 1) * per]
        fname = SHARD_NAMES[names].format(i=i + 1, n=shards)
        save({k: tensors[k] for k in part}, out_dir / fname, dict(metadata or {}))
        for k in part:
            weight_map[k] = fname
            total_size += _nbytes(tensors[k])
            total_params += _numel(tensors[k])
    index = {
        "metadata": {"total_size": total_size, "total_parameters": total_params},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (out_dir / INDEX).write_text(json.dumps(index, indent=4), encoding="utf-8")
    return weight_map


def build_published_hf(
    spec: TinySpec,
    out_dir: str | Path,
    published: Mapping[str, Any],
    *,
    mtp: bool = True,
    vision: bool = True,
    shards: int = 2,
    names: str = "qwen",
    template: str | None = None,
    tokenizer_config: Mapping[str, Any] | None = None,
) -> Path:
    """A bf16 HF checkpoint as Qwen ships it: `published`'s config.json with `spec`'s shape,
    `model.language_model.*` plus `model.visual.*` (vision) and `mtp.*` (mtp), in `shards`
    files behind the index. `template` replaces chat_template.jinja; `tokenizer_config`
    (a published tokenizer_config.json) replaces the tiny one, with its chat_template."""
    import torch
    from safetensors.torch import load_file, save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="snug-published-") as tmp:
        src = build_hf(spec, Path(tmp) / "hf", dtype="bfloat16")
        tensors: dict[str, torch.Tensor] = load_file(str(src / "model.safetensors"))
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(src / name, out / name)
    if not mtp:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}
    if not vision:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("model.visual.")}

    def save(arrays: dict[str, Any], path: Path, meta: dict[str, str]) -> None:
        save_file(arrays, str(path), metadata=meta)

    write_sharded(tensors, out, shards, names, {"format": "pt"}, save)
    config = shaped_config(published, spec)
    for key in ("quantization", "quantization_config") + (() if vision else ("vision_config",)):
        config.pop(key, None)  # bf16 weights; a text-only save has no vision tower
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    _write_chat_files(out, template, tokenizer_config)
    return out


def build_published_mlx(
    spec: TinySpec,
    out_dir: str | Path,
    published: Mapping[str, Any],
    *,
    bits: int = 4,
    group_size: int = 64,
    vision: bool = True,
    shards: int = 2,
    template: str | None = None,
) -> Path:
    """An MLX conversion as mlx-community publishes it: mlx-lm's quantized weights
    (`language_model.model.*`, no `mtp.*`) plus, as mlx-vlm keeps it, an unquantized bf16
    `vision_tower.*` (vision), in `shards` files named as mlx writes them, behind an index,
    and `published`'s config.json with `spec`'s shape and this quantization."""
    import mlx.core as mx

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="snug-published-") as tmp:
        src = build_mlx(spec, Path(tmp) / "mlx", bits=bits, group_size=group_size)
        arrays: dict[str, Any] = {}
        for path in sorted(src.glob("*.safetensors")):
            arrays.update(mx.load(str(path)))
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (src / name).is_file():
                shutil.copy(src / name, out / name)
    if vision:
        arrays.update(_vision_tower(spec))

    def save(part: dict[str, Any], path: Path, meta: dict[str, str]) -> None:
        mx.save_safetensors(str(path), part, metadata=meta)

    write_sharded(arrays, out, shards, "hf", {"format": "mlx"}, save)
    quant = {"group_size": group_size, "bits": bits, "mode": "affine"}
    config = shaped_config(published, spec, quantization=quant)
    if not vision:
        config.pop("vision_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=4), encoding="utf-8")
    _write_chat_files(out, template, None)
    return out


def _vision_tower(spec: TinySpec) -> dict[str, Any]:
    """A one-block vision tower under mlx-vlm's names (those of a published Qwen3.5 MLX
    conversion's weight listing), bf16, unquantized."""
    import mlx.core as mx

    v = VISION_CONFIG
    width, inner, patch = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = width * 4  # spatial_merge_size 2: four patches in one merged token
    shapes = {
        "vision_tower.patch_embed.proj.weight": (width, 2, patch, patch, 3),
        "vision_tower.patch_embed.proj.bias": (width,),
        "vision_tower.pos_embed.weight": (v["num_position_embeddings"], width),
        "vision_tower.merger.norm.weight": (width,),
        "vision_tower.merger.norm.bias": (width,),
        "vision_tower.merger.linear_fc1.weight": (merged, merged),
        "vision_tower.merger.linear_fc1.bias": (merged,),
        "vision_tower.merger.linear_fc2.weight": (spec.hidden_size, merged),
        "vision_tower.merger.linear_fc2.bias": (spec.hidden_size,),
    }
    block = {
        "attn.qkv": (3 * width, width),
        "attn.proj": (width, width),
        "mlp.linear_fc1": (inner, width),
        "mlp.linear_fc2": (width, inner),
    }
    for name, shape in block.items():
        shapes[f"vision_tower.blocks.0.{name}.weight"] = shape
        shapes[f"vision_tower.blocks.0.{name}.bias"] = (shape[0],)
    for norm in ("norm1", "norm2"):
        shapes[f"vision_tower.blocks.0.{norm}.weight"] = (width,)
        shapes[f"vision_tower.blocks.0.{norm}.bias"] = (width,)
    return {
        name: (0.02 * mx.random.normal(shape, key=mx.random.key(spec.seed + i))).astype(mx.bfloat16)
        for i, (name, shape) in enumerate(shapes.items())
    }


def _write_chat_files(
    out: Path, template: str | None, tokenizer_config: Mapping[str, Any] | None
) -> None:
    if tokenizer_config is not None:
        config = dict(tokenizer_config)
        if template is not None:
            config["chat_template"] = template
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), "utf-8")
    if template is not None:
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")


def _nbytes(array: Any) -> int:
    if hasattr(array, "nbytes"):
        return int(array.nbytes)
    return int(array.numel() * array.element_size())


def _numel(array: Any) -> int:
    return int(array.size) if isinstance(array.size, int) else int(array.numel())
