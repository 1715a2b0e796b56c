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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.config import EngineSettings
from engine.memory import TensorSpec, stream_state_bytes
from engine.memory.admission import CONTEXT_STEP
from engine.memory.decision import streams_text, tokens_text
from engine.memory.draft import draft_choice
from engine.memory.shapes import shape_tensor_specs
from engine.memory.wording import context_cap_text
from engine.model_config import ModelConfig, QuantConfig, QuantSpec

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
    asked, context = context, min(context, config.max_position_embeddings)
    draft = draft_choice(specs, config, settings).tokens
    weights = host_weight_bytes(specs, mtp=draft > 0)
    kv = settings.kv_cache
    each = stream_state_bytes(config, context, 4, kv, draft).total
    state = each * streams
    need = _need(weights, state)
    margin = need - weights - state
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
        f"state {gib(state)} for {streams_text(streams)} at {tokens_text(context)}, margin "
        f"{gib(margin)}; {gib(available)} available"
    )
    if asked > context:
        how += "; " + context_cap_text(asked, context)
    if need <= available:
        return HostDecision(
            FITS_IN_RAM, f"Runs on the CPU: needs {how}.", context, streams, available, breakdown
        )
    return HostDecision(
        TOO_LARGE_FOR_RAM,
        f"Too large for this machine's memory: needs {how}.",
        context,
        streams,
        available,
        breakdown,
        _changes(specs, config, settings, available, context, streams),
    )


def _need(weights: int, state: int) -> int:
    return weights + state + HOST_MARGIN_BYTES + (weights + state) // 10


def _changes(
    specs: Mapping[str, TensorSpec],
    config: ModelConfig,
    settings: EngineSettings,
    available: int,
    context: int,
    streams: int,
) -> tuple[str, ...]:
    """Changes that each make the model fit in `available` on their own (each checked)."""
    draft = draft_choice(specs, config, settings).tokens
    weights = host_weight_bytes(specs, mtp=draft > 0)

    def fits(weights: int, ctx: int, n: int, kv: str = settings.kv_cache) -> bool:
        each = stream_state_bytes(config, ctx, 4, kv, draft).total
        return _need(weights, each * n) <= available

    out = []
    ctx = _largest(lambda c: fits(weights, c, streams), context)
    if ctx:
        out.append(f"shorten the context to {ctx:,} tokens")
    fewer = max((n for n in range(1, streams) if fits(weights, context, n)), default=0)
    if fewer:
        out.append(f"use {streams_text(fewer)} instead of {streams:,}")
    if (
        settings.kv_cache != "int8"
        and config.full_layers
        and fits(weights, context, streams, "int8")
    ):
        out.append("use the 8-bit KV cache, int8")
    if all(spec.quant is None for spec in specs.values()):
        q_config = replace(config, quantization=QuantConfig(QuantSpec(4, 64)))
        q_weights = host_weight_bytes(shape_tensor_specs(q_config, "mlx4"))
        q_ctx = _largest(lambda c: fits(q_weights, c, streams), context)
        if q_ctx:
            shorter = f" with a context of {q_ctx:,} tokens" if q_ctx < context else ""
            out.append(f"use the MLX 4-bit build (weights {gib(q_weights)} in RAM){shorter}")
    if not out and streams > 1:
        # Neither alone: the most streams that leave a context of 256 tokens, at the
        # longest context they leave.
        most = max((n for n in range(1, streams) if fits(weights, CONTEXT_STEP, n)), default=0)
        ctx = _largest(lambda c: fits(weights, c, most), context) if most else 0
        if ctx:
            out.append(f"use {streams_text(most)} with a context of {ctx:,} tokens")
    if not out:
        out.append("choose a smaller model")
    return tuple(out)


def _largest(fits: Callable[[int], bool], context: int) -> int:
    """The largest context, `context` itself or a multiple of 256 below it, that fits; 0
    when not even 256 tokens do (the state grows with the context)."""
    if fits(context):
        return context
    lo, hi = 0, (context - 1) // CONTEXT_STEP
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid * CONTEXT_STEP) else (lo, mid - 1)
    return lo * CONTEXT_STEP


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
        return f"{n / (1 << 30):,.1f} GiB"
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.0f} {unit}"
    return f"{n:.0f} B"
