"""Bounds on config.json values: the JSON type of each key and the range that a Qwen3.5
dense model of up to a few hundred billion parameters stays within.

Every buffer the engine sizes comes from these values, so they are checked before anything
is sized from them: a 1 KB config.json asking for a million layers, or DeltaNet heads of
16384, is refused with a ConfigError naming the file, the key and the value instead of
costing gigabytes first. For scale, Qwen3.5-27B has hidden 5120, 64 layers, 24 query and 4
key/value heads of 256, DeltaNet 16 key and 48 value heads of 128, intermediate 17408 and a
vocabulary of 248320; every bound below leaves a large margin over a model ten times that.
"""

from __future__ import annotations

import math
from typing import Any

from engine.errors import ConfigError, quoted

# key: (smallest, largest) for the integer fields of ModelConfig.
INT_RANGES: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 65536),
    "num_hidden_layers": (1, 1024),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 1024),
    "linear_num_key_heads": (1, 1024),
    "linear_num_value_heads": (1, 1024),
    "linear_key_head_dim": (1, 1024),
    "linear_value_head_dim": (1, 1024),
    "linear_conv_kernel_dim": (1, 64),
    "intermediate_size": (1, 262144),
    "vocab_size": (1, 1 << 22),
    "max_position_embeddings": (1, 1 << 24),
    "mtp_num_hidden_layers": (0, 64),
    "full_attention_interval": (1, 1024),
}

# key: (low, high, low included) for the float fields; high is always included.
FLOAT_RANGES: dict[str, tuple[float, float, bool]] = {
    "rms_norm_eps": (0.0, 0.5, False),
    "rope_theta": (1.0, 1e12, True),
    "partial_rotary_factor": (0.0, 1.0, False),
}

# Products of fields that size one buffer, with the most a few-hundred-billion model needs.
PRODUCT_LIMITS: tuple[tuple[tuple[str, ...], int, str], ...] = (
    (("hidden_size", "intermediate_size"), 1 << 32, "elements in one MLP matrix"),
    (("vocab_size", "hidden_size"), 1 << 33, "elements in the embedding"),
    (("num_attention_heads", "head_dim"), 1 << 16, "query width"),
    (("num_key_value_heads", "head_dim"), 1 << 14, "key/value width of one token"),
    (("linear_num_key_heads", "linear_key_head_dim"), 1 << 16, "DeltaNet key width"),
    (("linear_num_value_heads", "linear_value_head_dim"), 1 << 16, "DeltaNet value width"),
    (
        ("linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"),
        1 << 24,
        "elements in one DeltaNet layer's recurrent state",
    ),
    (
        (
            "num_hidden_layers",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        ),
        1 << 30,
        "elements in the recurrent state of all layers",
    ),
    (
        ("num_hidden_layers", "num_key_value_heads", "head_dim"),
        1 << 19,
        "key/value cache elements of one token over all layers",
    ),
    (
        ("num_hidden_layers", "hidden_size", "intermediate_size"),
        1 << 38,
        "elements in one MLP matrix over all layers",
    ),
)

_FIX = "fix that key in config.json or fetch the model again"


def is_int(value: Any) -> bool:
    """A JSON integer (JSON `true` arrives as a Python bool, which is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(source: str, key: str, value: Any) -> int:
    """`value` as config.json's `key`: an integer within INT_RANGES[key]."""
    lo, hi = INT_RANGES[key]
    wanted = f"a positive integer at most {hi}" if lo == 1 else f"an integer in [{lo}, {hi}]"
    if not is_int(value):
        raise ConfigError(f"{source}: {key} = {quoted(value)} must be {wanted}; {_FIX}")
    if not lo <= value <= hi:
        raise ConfigError(
            f"{source}: {key} = {quoted(value)} must be {wanted} (the most any Qwen3.5 of a "
            f"few hundred billion parameters needs); {_FIX}"
        )
    return value


def check_float(source: str, key: str, value: Any) -> float:
    """`value` as config.json's `key`: a finite number within FLOAT_RANGES[key]."""
    lo, hi, lo_included = FLOAT_RANGES[key]
    span = f"{'[' if lo_included else '('}{lo:g}, {hi:g}]"
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ConfigError(f"{source}: {key} = {quoted(value)} must be a number in {span}; {_FIX}")
    number = float(value) if not is_int(value) or abs(value) < 1 << 1000 else math.inf
    above_low = number >= lo if lo_included else number > lo
    if not (math.isfinite(number) and above_low and number <= hi):
        raise ConfigError(
            f"{source}: {key} = {quoted(value)} is out of range: it must be a finite number "
            f"in {span}; {_FIX}"
        )
    return number


def check_bool(source: str, key: str, value: Any) -> bool:
    """`value` as config.json's `key`: a JSON boolean (the string "false" is not false)."""
    if not isinstance(value, bool):
        raise ConfigError(
            f"{source}: {key} = {quoted(value)} must be true or false (a JSON boolean, not a "
            f"string or number); {_FIX}"
        )
    return value


def check_eos_ids(source: str, ids: Any, vocab_size: int) -> None:
    for token in ids:
        if not is_int(token) or not 0 <= token < vocab_size:
            raise ConfigError(
                f"{source}: eos_token_id {quoted(token)} is not a token id of the vocabulary "
                f"(0 to {vocab_size - 1}); {_FIX}"
            )


def check_products(source: str, cfg: Any) -> None:
    """Refuse shapes whose buffers no real Qwen3.5 needs, before any is sized."""
    for keys, limit, what in PRODUCT_LIMITS:
        values = [getattr(cfg, k) for k in keys]
        total = math.prod(values)
        if total > limit:
            factors = " * ".join(f"{k} ({v})" for k, v in zip(keys, values, strict=True))
            raise ConfigError(
                f"{source}: {factors} = {total:,} {what}, over the {limit:,} that a Qwen3.5 "
                f"of a few hundred billion parameters needs; {_FIX}"
            )
