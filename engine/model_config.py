"""A model's config.json, typed and checked: its shapes, its layer schedule, its
quantization (MLX, per module where mixed), its stop ids and RoPE."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.config_checks import (
    FLOAT_RANGES,
    INT_RANGES,
    check_bool,
    check_eos_ids,
    check_float,
    check_int,
    check_products,
    is_int,
)
from engine.errors import ConfigError, quoted
from engine.json_limits import read_json_file

SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class QuantSpec:
    """Affine quantization of one module: `W = scales * q + biases`, per group of columns."""

    bits: int
    group_size: int
    mode: str = "affine"

    def __post_init__(self) -> None:
        if self.mode != "affine":
            raise ConfigError(
                f"quantization mode {quoted(self.mode)} is not supported: Snug reads MLX affine "
                "quantization only; convert the model again with mlx_lm.convert's default "
                "q_mode 'affine' and q_bits 4 or 8"
            )
        if self.bits not in (4, 8):
            raise ConfigError(
                f"quantization bits = {self.bits} is not supported: Snug reads 4- and 8-bit "
                "MLX checkpoints; convert the model again with q_bits 4 or 8"
            )
        if self.group_size not in (32, 64, 128):
            raise ConfigError(
                f"quantization group_size = {self.group_size} is not supported: convert the "
                "model again with q_group_size 32, 64 or 128"
            )


@dataclass(frozen=True)
class QuantConfig:
    """The checkpoint's default quantization plus per-module overrides (None = not quantized)."""

    default: QuantSpec
    overrides: Mapping[str, QuantSpec | None] = field(default_factory=dict)

    def for_module(self, path: str) -> QuantSpec | None:
        """The spec for a module path as written in the file, e.g.
        `language_model.model.layers.3.mlp.up_proj`."""
        if path in self.overrides:
            return self.overrides[path]
        return self.default


@dataclass(frozen=True)
class ModelConfig:
    """A Qwen3.5 dense text model's shape (read from `text_config`, or the flat form)."""

    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    eos_token_ids: tuple[int, ...] = ()
    mtp_num_hidden_layers: int = 0
    quantization: QuantConfig | None = None
    source: str = "config.json"

    def __post_init__(self) -> None:
        # Types and ranges first (config_checks), products next: all before anything is sized.
        source = self.source
        for f in fields(self):
            if f.name in INT_RANGES:
                check_int(source, f.name, getattr(self, f.name))
            elif f.name in FLOAT_RANGES:
                check_float(source, f.name, getattr(self, f.name))
        check_bool(source, "tie_word_embeddings", self.tie_word_embeddings)
        check_eos_ids(source, self.eos_token_ids, self.vocab_size)
        check_products(source, self)
        if not isinstance(self.layer_types, tuple) or not all(
            isinstance(t, str) for t in self.layer_types
        ):
            raise ConfigError(f"{source}: layer_types must be a list of strings")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"{self.source}: layer_types has {len(self.layer_types)} entries but "
                f"num_hidden_layers = {self.num_hidden_layers}"
            )
        unknown = sorted(set(self.layer_types) - {LINEAR, FULL})
        if unknown:
            raise ConfigError(
                f"{self.source}: layer_types holds unknown kinds {quoted(unknown)} (known: "
                f"{LINEAR}, {FULL})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"{self.source}: num_attention_heads = {self.num_attention_heads} is not a "
                f"multiple of num_key_value_heads = {self.num_key_value_heads}"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(
                f"{self.source}: linear_num_value_heads = {self.linear_num_value_heads} is not a "
                f"multiple of linear_num_key_heads = {self.linear_num_key_heads}"
            )
        if self.rotary_dim <= 0 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ConfigError(
                f"{self.source}: partial_rotary_factor = {self.partial_rotary_factor} gives "
                f"rotary dim {self.rotary_dim} for head_dim {self.head_dim}; it must be even "
                "and at most head_dim"
            )

    # Derived sizes, named as in the spec.
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def key_dim(self) -> int:  # KD
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:  # VD
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:  # C = 2*KD + VD
        return 2 * self.key_dim + self.value_dim

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def quantized(self) -> bool:
        return self.quantization is not None


def _layer_schedule(text: Mapping[str, Any], n_layers: int, source: str) -> tuple[str, ...]:
    types = text.get("layer_types")
    if types is not None:
        if not isinstance(types, list):
            raise ConfigError(f"{source}: layer_types must be a list, got {type(types).__name__}")
        if len(types) != n_layers:  # checked before the list is copied
            raise ConfigError(
                f"{source}: layer_types has {len(types)} entries but num_hidden_layers = {n_layers}"
            )
        return tuple(types)
    interval = check_int(source, "full_attention_interval", text.get("full_attention_interval", 4))
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers))


# What mlx quantizes with when an entry leaves bits or group_size out or null (mlx.nn's
# per-mode defaults): mlx-lm's mixed-bit recipes run without --q-group-size write
# `"group_size": null` into every per-module entry.
MODE_DEFAULTS = {"affine": (4, 64), "mxfp4": (4, 32), "nvfp4": (4, 16), "mxfp8": (8, 32)}
MIXED_HINT = (
    "; such per-module entries come from mixed-bit conversions (mlx_lm.convert --quant-predicate "
    "mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6; mlx_lm.dynamic_quant's default --high-bits "
    "5): convert without --quant-predicate, or with dynamic_quant --low-bits 4 --high-bits 8"
)


def _quant_spec(raw: Any, where: str, per_module: bool = False) -> QuantSpec:
    bits, group, mode = (
        (raw.get("bits"), raw.get("group_size"), raw.get("mode"))
        if isinstance(raw, Mapping)
        else (False, False, False)
    )
    mode = "affine" if mode is None else mode
    if isinstance(mode, str):  # an unknown mode is refused by name in QuantSpec
        default_bits, default_group = MODE_DEFAULTS.get(mode, (0, 0))
        bits = default_bits if bits is None else bits
        group = default_group if group is None else group
    if not (isinstance(mode, str) and is_int(bits) and is_int(group)):
        raise ConfigError(
            f"{where}: quantization entry {quoted(raw)} needs integer bits and group_size "
            "(and a string mode, if any)"
        )
    try:
        return QuantSpec(bits=bits, group_size=group, mode=mode)
    except ConfigError as exc:
        hint = MIXED_HINT if per_module and mode == "affine" and bits not in (4, 8) else ""
        raise ConfigError(f"{where}: {exc}{hint}") from None


def _quantization(top: Mapping[str, Any], text: Mapping[str, Any], source: str):
    raw = top.get("quantization") or top.get("quantization_config")
    if raw is None:
        raw = text.get("quantization") or text.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: quantization must be an object, got {quoted(raw)}")
    method = raw.get("quant_method", "mlx")
    if method != "mlx":
        raise ConfigError(
            f"{source}: quantization with quant_method = {quoted(method)} is not supported: "
            "Snug reads unquantized Qwen3.5 weights (bf16, fp16, fp32) and MLX affine 4- and "
            "8-bit conversions (mlx_lm.convert -q); use the original bf16 model or such a "
            "conversion of it"
        )
    default = _quant_spec(raw, source)
    overrides: dict[str, QuantSpec | None] = {}
    for key, value in raw.items():
        if key in ("bits", "group_size", "mode", "quant_method"):
            continue
        if value is False:
            overrides[key] = None
        elif isinstance(value, Mapping):
            where = f"{source} [quantization.{quoted(key)}]"
            overrides[key] = _quant_spec(value, where, per_module=True)
    return QuantConfig(default=default, overrides=overrides)


def _eos_ids(top: Mapping[str, Any], text: Mapping[str, Any], source: str) -> tuple[int, ...]:
    ids: list[int] = []
    for raw in (text.get("eos_token_id"), top.get("eos_token_id")):
        if raw is None:
            continue
        for value in raw if isinstance(raw, list) else [raw]:
            if not is_int(value):
                raise ConfigError(
                    f"{source}: eos_token_id {quoted(value)} must be an integer token id or a "
                    "list of them; fix it in config.json"
                )
            if value not in ids:
                ids.append(value)
    return tuple(ids)


def _rope(text: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """`rope_parameters` (transformers 5) or `rope_scaling` (older saves), or {}."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = text.get(key)
        if rope is None:
            continue
        if not isinstance(rope, Mapping):
            raise ConfigError(
                f"{source}: {key} = {quoted(rope)} must be an object such as "
                '{"rope_theta": 10000000, "partial_rotary_factor": 0.25}; fix it in config.json'
            )
        if rope:
            return rope
    return {}


def parse_config(top: Any, source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from a parsed config.json (nested `qwen3_5` or flat `qwen3_5_text`).

    Every value is checked for its JSON type and range (engine.config_checks) as it is read,
    so anything but a plausible Qwen3.5 ends in a ConfigError naming the key and value.
    """
    if not isinstance(top, Mapping):
        raise ConfigError(f"{source}: the top level must be a JSON object, got {quoted(top)}")
    model_type = top.get("model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{source}: model_type {quoted(model_type)} is not supported; Snug runs Qwen3.5 "
            f"dense models ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    text = top.get("text_config", top) if model_type == "qwen3_5" else top
    if not isinstance(text, Mapping):
        raise ConfigError(f"{source}: text_config must be an object, got {quoted(text)}")
    required = (
        "hidden_size num_hidden_layers num_attention_heads num_key_value_heads "
        "linear_num_key_heads linear_num_value_heads linear_key_head_dim linear_value_head_dim "
        "intermediate_size vocab_size"
    ).split()
    missing = [k for k in required if k not in text]
    if missing:
        raise ConfigError(f"{source}: text_config is missing {', '.join(missing)}")
    defaults = {
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 262144,
        "mtp_num_hidden_layers": 0,
    }
    ints = {
        key: check_int(source, key, text.get(key, defaults.get(key)))
        for key in (*required, *defaults)
        if key != "mtp_num_hidden_layers" or text.get(key) is not None
    }
    rope = _rope(text, source)
    floats = {
        "rms_norm_eps": text.get("rms_norm_eps", 1e-6),
        "rope_theta": rope.get("rope_theta", text.get("rope_theta", 1e7)),
        "partial_rotary_factor": rope.get(
            "partial_rotary_factor", text.get("partial_rotary_factor", 0.25)
        ),
    }
    tie = text.get("tie_word_embeddings", top.get("tie_word_embeddings", False))
    return ModelConfig(
        **ints,
        layer_types=_layer_schedule(text, ints["num_hidden_layers"], source),
        **{key: check_float(source, key, value) for key, value in floats.items()},
        tie_word_embeddings=check_bool(source, "tie_word_embeddings", tie),
        eos_token_ids=_eos_ids(top, text, source),
        quantization=_quantization(top, text, source),
        source=source,
    )


MAX_CONFIG_BYTES = 16 << 20  # a real config.json is a few KB; MLX overrides add tens of KB


def load_config(model_dir: str | os.PathLike[str]) -> ModelConfig:
    """Read `<model_dir>/config.json`; raise ConfigError that names the file on any problem."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"{path}: config.json not found; pick a folder that holds a Hugging Face or MLX "
            "checkpoint (config.json, *.safetensors, tokenizer.json)"
        )
    top = read_json_file(path, ConfigError, MAX_CONFIG_BYTES)
    return parse_config(top, source=str(path))
