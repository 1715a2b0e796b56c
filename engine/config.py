"""Typed configuration: the model's config.json and the engine's settings.

This is the one module that reads environment variables (see `EngineSettings.from_env`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
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
GIB = 1 << 30
# The most GiB a memory or cache setting takes (1 PiB, as the app's settings dialog allows):
# more than any card, host or disk holds, and far below a size whose bytes overflow a float.
MAX_GIB = float(1 << 20)


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


# ---------------------------------------------------------------------------------------------
# Engine settings (memory reserve and limit, backend). The one place os.environ is read.

ENV_RESERVE = "SNUG_MEMORY_RESERVE_GIB"
ENV_LIMIT = "SNUG_MEMORY_LIMIT_GIB"
ENV_BACKEND = "SNUG_BACKEND"
ENV_CACHE = "SNUG_CACHE_DIR"
ENV_DTYPE = "SNUG_COMPUTE_DTYPE"
ENV_OVERLAP = "SNUG_OVERLAP_LAUNCHES"
ENV_BATCH_INVARIANT = "SNUG_BATCH_INVARIANT"
ENV_PROMPT_CACHE = "SNUG_PROMPT_CACHE_DIR"
ENV_HOST_CACHE = "SNUG_PROMPT_CACHE_HOST_GIB"
ENV_DISK_CACHE = "SNUG_PROMPT_CACHE_DISK_GIB"
ENV_KV_CACHE = "SNUG_KV_CACHE"
ENV_DEVICE_PROPS = "SNUG_DEVICE_PROPS"
ENV_DRAFT = "SNUG_DRAFT_TOKENS"
COMPUTE_DTYPES = ("bfloat16", "float16", "float32")
# The full-attention layers' KV cache: "bf16" holds keys and values in the activation type
# (bf16; fp16 on cards without bf16, fp32 in the fp32 exactness mode), "int8" holds 8-bit
# codes with one fp32 scale per token and KV head (engine/backends/kv_int8.py).
KV_CACHES = ("bf16", "int8")
DEFAULT_RESERVE_GIB = 0.5
# Drafting with the checkpoint's MTP head (engine/drafting.py): tokens drafted a step, or
# "auto" (chosen from the acceptance seen so far), or "off".
DRAFT_CHOICES = ("off", "1", "2", "3", "auto")
MAX_DRAFT_TOKENS = 3


def draft_setting(value: Any) -> str:
    """The canonical draft_tokens setting for `value` (0 / "0" / "off", 1..3, "auto");
    ConfigError for anything else."""
    text = str(value).strip().lower()
    text = "off" if text in ("0", "none", "") else text
    if isinstance(value, bool) or text not in DRAFT_CHOICES:
        raise ConfigError(
            f"draft tokens {value!r} is unknown: choose {', '.join(DRAFT_CHOICES)} "
            f"({ENV_DRAFT}, --draft-tokens, or the drafting setting)"
        )
    return text


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
    # Batch-invariant decode: a stream's tokens and logits do not depend on which streams
    # share its decode steps (each row summed in the order it is at one row; the CUDA
    # backend's projections and attention). `snug serve` turns it on where it admits more
    # than one stream.
    batch_invariant: bool = False
    # The prompt cache's lower tiers (engine.prompt_cache): saved states in host memory, and
    # on disk in `prompt_cache_dir` (None: no disk tier). 0 bytes turns a tier off.
    prompt_cache_dir: str | None = None
    prompt_cache_host_bytes: int = 2 * GIB
    prompt_cache_disk_bytes: int = 8 * GIB
    kv_cache: str = "bf16"  # KV_CACHES: the cache in the activation type, or 8-bit
    # Tests and measurements only: the CUDA backend reads the GPU as a card with these
    # properties ("sms=20,l2_mb=2,smem_kb=99": `parse_device_props`; "": the GPU's own).
    device_props: str = ""
    draft_tokens: str = "off"  # DRAFT_CHOICES (an int 0..3 is taken too)

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
        object.__setattr__(self, "draft_tokens", draft_setting(self.draft_tokens))
        parse_device_props(self.device_props)  # ConfigError, naming the part, if malformed
        if self.kv_cache not in KV_CACHES:
            raise ConfigError(
                f"kv_cache {self.kv_cache!r} is unknown: choose {' or '.join(KV_CACHES)} "
                f"({ENV_KV_CACHE}, --kv-cache, or the KV cache setting)"
            )
        for name, value, env in (
            ("host", self.prompt_cache_host_bytes, ENV_HOST_CACHE),
            ("disk", self.prompt_cache_disk_bytes, ENV_DISK_CACHE),
        ):
            if value < 0:
                raise ConfigError(f"prompt cache {name} budget {value} bytes is negative ({env})")

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
        overlap = env_switch(ENV_OVERLAP, env)
        if overlap is not None:
            out = replace(out, overlap_launches=overlap)
        invariant = env_switch(ENV_BATCH_INVARIANT, env)
        if invariant is not None:
            out = replace(out, batch_invariant=invariant)
        if env.get(ENV_PROMPT_CACHE, "").strip():
            out = replace(out, prompt_cache_dir=env[ENV_PROMPT_CACHE].strip())
        if env.get(ENV_HOST_CACHE, "").strip():
            host = _gib(env[ENV_HOST_CACHE], ENV_HOST_CACHE)
            out = replace(out, prompt_cache_host_bytes=int(round(host * GIB)))
        if env.get(ENV_DISK_CACHE, "").strip():
            disk = _gib(env[ENV_DISK_CACHE], ENV_DISK_CACHE)
            out = replace(out, prompt_cache_disk_bytes=int(round(disk * GIB)))
        if env.get(ENV_KV_CACHE, "").strip():
            out = replace(out, kv_cache=env[ENV_KV_CACHE].strip().lower())
        if env.get(ENV_DEVICE_PROPS, "").strip():
            out = replace(out, device_props=env[ENV_DEVICE_PROPS].strip())
        if env.get(ENV_DRAFT, "").strip():
            out = replace(out, draft_tokens=env[ENV_DRAFT])
        return out

    @property
    def draft_max(self) -> int:
        """The most tokens a step may draft: 0 (off), the fixed count, or 3 for "auto"."""
        if self.draft_tokens == "off":
            return 0
        return MAX_DRAFT_TOKENS if self.draft_tokens == "auto" else int(self.draft_tokens)

    def with_gib(self, reserve: float | None = None, limit: float | None = None) -> EngineSettings:
        """Override reserve and/or limit in GiB (a limit of 0 means none); each from 0 to
        MAX_GIB."""
        for name, value, where in (
            ("reserve", reserve, f"--reserve-gib, {ENV_RESERVE}"),
            ("limit", limit, f"--limit-gib, {ENV_LIMIT}"),
        ):
            if value is not None and not 0 <= value <= MAX_GIB:  # NaN fails both
                raise ConfigError(
                    f"memory {name} {value!r} GiB: must be from 0 to {MAX_GIB:,.0f} ({where})"
                )
        out = self
        if reserve is not None:
            out = replace(out, reserve_bytes=int(round(reserve * GIB)))
        if limit is not None:
            out = replace(out, limit_bytes=int(round(limit * GIB)) if limit > 0 else None)
        return out


# SNUG_DEVICE_PROPS names: the Card field (engine/backends/cuda/card.py) each sets, its unit.
DEVICE_PROPS = {
    "sms": ("sm_count", 1),
    "l2_mb": ("l2_bytes", 1 << 20),
    "smem_kb": ("smem_per_block", 1024),
}


# The largest value each SNUG_DEVICE_PROPS part takes: past any card's SMs, L2 MiB or KiB of
# shared memory a block, so that the counts and bytes stay within the kernels' 32-bit arguments.
MAX_PROP = 1024


def parse_device_props(text: str) -> dict[str, int]:
    """SNUG_DEVICE_PROPS ("sms=20,l2_mb=2,smem_kb=99", any of the three, comma-separated:
    SMs, L2 MiB, shared KiB one block may opt in to) as the card properties it sets, in
    counts and bytes ({"sm_count": 20, "l2_bytes": 2097152, "smem_per_block": 101376});
    {} for "". ConfigError naming the part that is not one of those with a whole number from 1
    to MAX_PROP."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, value = (x.strip() for x in part.partition("="))
        if name not in DEVICE_PROPS or not value.isdigit() or not 1 <= int(value) <= MAX_PROP:
            raise ConfigError(
                f"{ENV_DEVICE_PROPS}: {part!r} is not one of {', '.join(DEVICE_PROPS)} set to a "
                f'whole number from 1 to {MAX_PROP:,} (e.g. "sms=20,l2_mb=2,smem_kb=99")'
            )
        key, unit = DEVICE_PROPS[name]
        out[key] = int(value) * unit
    return out


def env_switch(name: str, environ: Mapping[str, str] | None = None) -> bool | None:
    """An on/off variable: 1 or 0, None where it is unset or empty (the default holds)."""
    env = os.environ if environ is None else environ
    value = env.get(name, "").strip()
    if not value:
        return None
    if value not in ("0", "1"):
        raise ConfigError(f"{name}={value!r} must be 0 or 1")
    return value == "1"


def _gib(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number of GiB") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_GIB:
        raise ConfigError(f"{name}={text!r} must be a number of GiB from 0 to {MAX_GIB:,.0f}")
    return value


def default_data_dir(environ: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """The app's data folder, as Qt's AppDataLocation names it for organisation and
    application "Snug" (the chats live there too): the engine finds it without Qt, so that
    `snug cache clear` clears what the app keeps."""
    env = os.environ if environ is None else environ
    platform = platform or sys.platform
    home = Path(env.get("HOME") or Path.home())
    if platform == "win32":
        base = Path(env.get("APPDATA") or home / "AppData" / "Roaming")
    elif platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        xdg = env.get("XDG_DATA_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else home / ".local" / "share"
    return base / "Snug" / "Snug"


def default_prompt_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the prompt cache's disk tier lives: SNUG_PROMPT_CACHE_DIR, else
    `<data folder>/prompt-cache`."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENV_PROMPT_CACHE, "").strip()
    return Path(chosen) if chosen else default_data_dir(env) / "prompt-cache"
