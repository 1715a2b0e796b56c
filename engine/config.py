"""Typed configuration: the model's config.json and the engine's settings.

This is the one module that reads environment variables (see `EngineSettings.from_env`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
LINEAR, FULL = "linear_attention", "full_attention"
GIB = 1 << 30


@dataclass(frozen=True)
class QuantSpec:
    """Affine quantization of one module: `W = scales * q + biases`, per group of columns."""

    bits: int
    group_size: int
    mode: str = "affine"

    def __post_init__(self) -> None:
        if self.mode != "affine":
            raise ConfigError(
                f"quantization mode {self.mode!r} is not supported "
                "(only 'affine', as mlx-lm writes)"
            )
        if self.bits not in (4, 8):
            raise ConfigError(
                f"quantization bits = {self.bits} is not supported: Snug reads 4- and 8-bit "
                "MLX checkpoints; convert the model again with bits 4 or 8"
            )
        if self.group_size not in (32, 64, 128):
            raise ConfigError(
                f"quantization group_size = {self.group_size} is not supported (32, 64 or 128)"
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
        positive = (
            "hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim "
            "linear_num_key_heads linear_num_value_heads linear_key_head_dim "
            "linear_value_head_dim linear_conv_kernel_dim intermediate_size vocab_size"
        ).split()
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{self.source}: {name} = {value!r} must be a positive integer")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ConfigError(
                f"{self.source}: layer_types has {len(self.layer_types)} entries but "
                f"num_hidden_layers = {self.num_hidden_layers}"
            )
        unknown = sorted(set(self.layer_types) - {LINEAR, FULL})
        if unknown:
            raise ConfigError(f"{self.source}: layer_types holds unknown kinds {unknown}")
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
        if not (0 < self.rms_norm_eps < 1):
            raise ConfigError(f"{self.source}: rms_norm_eps = {self.rms_norm_eps} is out of range")

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
        return tuple(types)
    interval = text.get("full_attention_interval", 4)
    if not isinstance(interval, int) or interval <= 0:
        raise ConfigError(f"{source}: full_attention_interval = {interval!r} must be positive")
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers))


def _quant_spec(raw: Any, where: str) -> QuantSpec:
    try:
        return QuantSpec(
            bits=int(raw["bits"]), group_size=int(raw["group_size"]), mode=raw.get("mode", "affine")
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: quantization entry {raw!r} needs bits and group_size") from exc
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _quantization(top: Mapping[str, Any], text: Mapping[str, Any], source: str):
    raw = top.get("quantization") or top.get("quantization_config")
    if raw is None:
        raw = text.get("quantization") or text.get("quantization_config")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: quantization must be an object, got {raw!r}")
    default = _quant_spec(raw, source)
    overrides: dict[str, QuantSpec | None] = {}
    for key, value in raw.items():
        if key in ("bits", "group_size", "mode", "quant_method"):
            continue
        if value is False:
            overrides[key] = None
        elif isinstance(value, Mapping):
            overrides[key] = _quant_spec(value, f"{source} [quantization.{key}]")
    return QuantConfig(default=default, overrides=overrides)


def _eos_ids(top: Mapping[str, Any], text: Mapping[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for raw in (text.get("eos_token_id"), top.get("eos_token_id")):
        for value in raw if isinstance(raw, list) else [raw]:
            if isinstance(value, int) and value not in ids:
                ids.append(value)
    return tuple(ids)


def parse_config(top: Mapping[str, Any], source: str = "config.json") -> ModelConfig:
    """Build a ModelConfig from a parsed config.json (nested `qwen3_5` or flat `qwen3_5_text`)."""
    model_type = top.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{source}: model_type {model_type!r} is not supported; Snug runs Qwen3.5 dense "
            f"models ({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    text = top.get("text_config", top) if model_type == "qwen3_5" else top
    if not isinstance(text, Mapping):
        raise ConfigError(f"{source}: text_config must be an object")
    required = (
        "hidden_size num_hidden_layers num_attention_heads num_key_value_heads "
        "linear_num_key_heads linear_num_value_heads linear_key_head_dim linear_value_head_dim "
        "intermediate_size vocab_size"
    ).split()
    missing = [k for k in required if k not in text]
    if missing:
        raise ConfigError(f"{source}: text_config is missing {', '.join(missing)}")
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    n_layers = text["num_hidden_layers"]
    tie = text.get("tie_word_embeddings", top.get("tie_word_embeddings", False))
    try:
        return ModelConfig(
            hidden_size=text["hidden_size"],
            num_hidden_layers=n_layers,
            layer_types=_layer_schedule(text, n_layers if isinstance(n_layers, int) else 0, source),
            num_attention_heads=text["num_attention_heads"],
            num_key_value_heads=text["num_key_value_heads"],
            head_dim=text.get("head_dim", 256),
            linear_num_key_heads=text["linear_num_key_heads"],
            linear_num_value_heads=text["linear_num_value_heads"],
            linear_key_head_dim=text["linear_key_head_dim"],
            linear_value_head_dim=text["linear_value_head_dim"],
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
            intermediate_size=text["intermediate_size"],
            vocab_size=text["vocab_size"],
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 1e7))),
            partial_rotary_factor=float(
                rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
            ),
            tie_word_embeddings=bool(tie),
            max_position_embeddings=int(text.get("max_position_embeddings", 262144)),
            eos_token_ids=_eos_ids(top, text),
            mtp_num_hidden_layers=int(text.get("mtp_num_hidden_layers", 0) or 0),
            quantization=_quantization(top, text, source),
            source=source,
        )
    except TypeError as exc:
        raise ConfigError(f"{source}: a field has the wrong type ({exc})") from exc


def load_config(model_dir: str | os.PathLike[str]) -> ModelConfig:
    """Read `<model_dir>/config.json`; raise ConfigError that names the file on any problem."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"{path}: config.json not found; pick a folder that holds a Hugging Face or MLX "
            "checkpoint (config.json, *.safetensors, tokenizer.json)"
        )
    try:
        top = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as JSON ({exc})") from exc
    if not isinstance(top, dict):
        raise ConfigError(f"{path}: the top level must be a JSON object")
    return parse_config(top, source=str(path))


# ---------------------------------------------------------------------------------------------
# Engine settings (memory reserve and limit, backend). The one place os.environ is read.

ENV_RESERVE = "SNUG_MEMORY_RESERVE_GIB"
ENV_LIMIT = "SNUG_MEMORY_LIMIT_GIB"
ENV_BACKEND = "SNUG_BACKEND"
ENV_CACHE = "SNUG_CACHE_DIR"
ENV_DTYPE = "SNUG_COMPUTE_DTYPE"
ENV_OVERLAP = "SNUG_OVERLAP_LAUNCHES"
COMPUTE_DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_RESERVE_GIB = 0.5


@dataclass(frozen=True)
class EngineSettings:
    """Memory and backend settings. Sources, last wins: defaults, environment, app or CLI."""

    reserve_bytes: int = int(DEFAULT_RESERVE_GIB * GIB)
    limit_bytes: int | None = None
    backend: str = "auto"
    cache_dir: str | None = None
    compute_dtype: str = "bfloat16"  # GPU activations; float16 for cards without bf16
    # Let each GPU kernel start while the previous one finishes (Hopper and newer); off
    # only to measure what it gains or to rule it out.
    overlap_launches: bool = True

    def __post_init__(self) -> None:
        if self.reserve_bytes < 0:
            raise ConfigError(f"memory reserve {self.reserve_bytes} bytes must not be negative")
        if self.limit_bytes is not None and self.limit_bytes <= 0:
            raise ConfigError(f"memory limit {self.limit_bytes} bytes must be positive")
        if self.backend not in ("auto", "cuda", "numpy"):
            raise ConfigError(
                f"backend {self.backend!r} is unknown: choose auto, cuda or numpy ({ENV_BACKEND})"
            )
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ConfigError(
                f"compute dtype {self.compute_dtype!r} is unknown: choose "
                f"{', '.join(COMPUTE_DTYPES)} ({ENV_DTYPE})"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EngineSettings:
        env = os.environ if environ is None else environ
        out = cls()
        if env.get(ENV_RESERVE, "").strip():
            out = out.with_gib(reserve=_gib(env[ENV_RESERVE], ENV_RESERVE))
        if env.get(ENV_LIMIT, "").strip():
            out = out.with_gib(limit=_gib(env[ENV_LIMIT], ENV_LIMIT))
        if env.get(ENV_BACKEND, "").strip():
            out = replace(out, backend=env[ENV_BACKEND].strip())
        if env.get(ENV_CACHE, "").strip():
            out = replace(out, cache_dir=env[ENV_CACHE].strip())
        if env.get(ENV_DTYPE, "").strip():
            out = replace(out, compute_dtype=env[ENV_DTYPE].strip())
        overlap = env.get(ENV_OVERLAP, "").strip()
        if overlap:
            if overlap not in ("0", "1"):
                raise ConfigError(f"{ENV_OVERLAP}={overlap!r} must be 0 or 1")
            out = replace(out, overlap_launches=overlap == "1")
        return out

    def with_gib(self, reserve: float | None = None, limit: float | None = None) -> EngineSettings:
        """Override reserve and/or limit in GiB (a limit of 0 means none)."""
        out = self
        if reserve is not None:
            out = replace(out, reserve_bytes=int(round(reserve * GIB)))
        if limit is not None:
            out = replace(out, limit_bytes=int(round(limit * GIB)) if limit > 0 else None)
        return out


def _gib(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number of GiB") from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name}={text!r} must be a finite, non-negative number of GiB")
    return value
