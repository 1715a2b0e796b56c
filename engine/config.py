"""The engine's settings: memory reserve and limit, backend, compute dtype, caches, and
the simulated card's properties.

The engine's environment variables are read here (`EngineSettings.from_env`), but for
SNUG_W4_MMA, a measuring switch of the CUDA backend's 4-bit products that
engine/backends/cuda/w4_mma.py reads itself.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

GIB = 1 << 30
# The most GiB a memory or cache setting takes (1 PiB, as the app's settings dialog allows):
# more than any card, host or disk holds, and far below a size whose bytes overflow a float.
MAX_GIB = float(1 << 20)


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
            out = replace(out, backend=env[ENV_BACKEND].strip().lower())
        if env.get(ENV_CACHE, "").strip():
            out = replace(out, cache_dir=env[ENV_CACHE].strip())
        if env.get(ENV_DTYPE, "").strip():
            out = replace(out, compute_dtype=env[ENV_DTYPE].strip().lower())
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
            out = replace(out, draft_tokens=env[ENV_DRAFT].strip().lower())
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
        if limit is not None and 0 < limit and round(limit * GIB) < 1:
            # Not 0 (no limit), yet not one byte: refused here, by the setting's name.
            raise ConfigError(
                f"memory limit {limit!r} GiB is less than a byte: set 0 for no limit, or a "
                f"limit the model fits in, such as 4 (--limit-gib, {ENV_LIMIT})"
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
        comma = " (with a point, not a comma)" if "," in text else ""
        raise ConfigError(
            f"{name}={text!r} is not a number of GiB: set a plain number{comma}, such as 4 or 3.5"
        ) from None
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
