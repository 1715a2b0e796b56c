"""Fit verdicts without a GPU: will the model fit in this machine's available RAM?

The numpy backend (CPU mode) reads every dense tensor widened to float32 and keeps
quantized matrices packed (codes as stored, scales and biases in float32); its stream state
is float32 too. So the estimate is

    weights as the CPU backend holds them  (dense: 4 bytes per element; 4-bit: codes +
                                            float32 scales and biases; mtp.* only where
                                            the settings draft with them)
  + stream state at the context, x streams (float32; the 8-bit KV cache: codes and a
    float32 scale per token and KV head; drafting: the MTP head's KV and verify rows)
  + a margin (HOST_MARGIN_BYTES + 10%) for the tokenizer, Python and the forward's buffers

The backend's cache of dequantized matrices is not counted: it is sized to a share of the
machine's RAM and only speeds decoding up. Like `app.planning.plan`, this is pure Python
over engine.memory and runs on the planning thread.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.config import EngineSettings, ModelConfig
from engine.memory import TensorSpec, stream_state_bytes
from engine.memory.draft import draft_choice

HOST_MARGIN_BYTES = 512 << 20
FITS_IN_RAM = "fits in RAM"
TOO_LARGE_FOR_RAM = "too large for RAM"
LABELS = {FITS_IN_RAM: "Fits in RAM (CPU)", TOO_LARGE_FOR_RAM: "Too large for RAM"}


@dataclass(frozen=True)
class HostDecision:
    """A CPU-mode verdict with its byte breakdown; `verdict` is FITS_IN_RAM or TOO_LARGE."""

    verdict: str
    reason: str
    context: int
    streams: int
    available: int
    breakdown: dict[str, int] = field(default_factory=dict)
    suggestions: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.verdict == FITS_IN_RAM

    @property
    def label(self) -> str:
        return LABELS[self.verdict]


def available_ram() -> int:
    """Bytes of RAM available to a new program (MemAvailable on Linux; free pages otherwise)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def host_weight_bytes(specs: Mapping[str, TensorSpec], mtp: bool = False) -> int:
    """Bytes of weights as the numpy backend holds them (see the module docstring); `mtp`:
    the MTP head's too (drafting)."""
    total = 0
    for name, spec in specs.items():
        if name.startswith("mtp.") and not mtp:
            continue
        n = math.prod(spec.shape)
        if spec.quant is not None:
            out, cols = spec.shape[0], spec.shape[1]
            groups = out * (cols // spec.quant.group_size)
            total += n * spec.quant.bits // 8 + 2 * groups * 4
        else:
            total += n * 4
    return total


def host_decide(
    specs: Mapping[str, TensorSpec],
    config: ModelConfig,
    *,
    available: int,
    context: int,
    streams: int,
    settings: EngineSettings | None = None,
) -> HostDecision:
    """The CPU-mode verdict for a model with these tensors at `context` x `streams`, with
    the KV cache and drafting `settings` ask for."""
    settings = settings or EngineSettings()
    context = min(context, config.max_position_embeddings)
    draft = draft_choice(specs, config, settings).tokens
    weights = host_weight_bytes(specs, mtp=draft > 0)
    kv = settings.kv_cache
    each = stream_state_bytes(config, context, 4, kv, draft).total
    state = each * streams
    margin = HOST_MARGIN_BYTES + (weights + state) // 10
    need = weights + state + margin
    breakdown = {
        "weights": weights,
        "stream_state_each": each,
        "stream_state_total": state,
        "margin": margin,
        "need": need,
        "available": available,
        "free_after": available - need,
    }
    how = (
        f"about {gib(need)} of RAM: weights {gib(weights)} as the CPU backend holds them, "
        f"state {gib(state)} at {context:,} tokens x {streams}, margin {gib(margin)}; "
        f"{gib(available)} available"
    )
    if need <= available:
        return HostDecision(
            FITS_IN_RAM, f"Runs on the CPU: needs {how}.", context, streams, available, breakdown
        )
    tips = ["a 4-bit model of the same size", "a smaller model"]
    if state > weights // 4 or streams > 1:
        tips.insert(0, "a shorter context or fewer streams")
    return HostDecision(
        TOO_LARGE_FOR_RAM,
        f"Too large for this machine's memory: needs {how}.",
        context,
        streams,
        available,
        breakdown,
        tuple(f"try {t}" for t in tips),
    )


def plan_on_host(
    *,
    available: int,
    context: int,
    streams: int,
    model_dir: str | None = None,
    shape: tuple[ModelConfig, str, int] | None = None,
    settings: EngineSettings | None = None,
) -> Any:
    """host_decide for a checkpoint on disk or a catalog shape (as `planning.plan` takes
    them), or a planning.PlanProblem saying why there is no verdict."""
    from app import planning

    try:
        config, specs = planning.model_specs(model_dir, shape)
        return host_decide(
            specs, config, available=available, context=context, streams=streams, settings=settings
        )
    except Exception as exc:  # unreadable folder, bad config
        return planning.PlanProblem(f"{type(exc).__name__}: {exc}", "Cannot plan")


def gib(n: float) -> str:
    """Bytes for the user: GiB with one decimal from 1 GiB up, smaller units below."""
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"
