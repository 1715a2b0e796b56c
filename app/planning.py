"""Fit verdicts before loading: the app's adapter over `engine.memory` and `engine.device`.

The verdict comes from `engine.memory.decide`, the same function `Engine.load` admits with,
given the tensor specs of the checkpoint's headers (or of a catalog entry's shape, which are
those of its download), so the preview and the load reach the same Decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from engine import device as engine_device
from engine import memory
from engine.backends.cuda.card import runs_mma
from engine.config import EngineSettings
from engine.memory import Card, TensorSpec, checkpoint_specs, shapes
from engine.memory.speed import CardSpeed
from engine.model_config import ModelConfig, parse_config

VERDICT_LABELS = {
    "fits": "Fits",
    "fits with lazy scratch": "Fits, slower prompts",
    "fits with host embeddings": "Fits, part in RAM",
    "does not fit": "Does not fit",
}
BAR_PARTS = (  # (breakdown key, label, colour) in the order the stacked bar draws them
    ("weights", "Weights", "#4f6bed"),
    ("stream_state_total", "Stream state", "#2aa198"),
    ("prompt_cache", "Prompt cache", "#8e6fd8"),
    ("scratch_peak", "Scratch peak", "#e08a2e"),
    ("workspace_peak", "Workspace", "#d9b43c"),
    ("reserve", "Reserve", "#9aa3ad"),
    ("free_after", "Free", "#dfe5ea"),
)


@dataclass(frozen=True)
class Gpu:
    """What planning needs to know of the card (a subset of engine.device.GpuInfo)."""

    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int = 0
    driver: str = ""
    speed: CardSpeed | None = None  # for the decision's speed prediction
    capability: int = 0  # 10 * major + minor, as NVML reports it (0: unknown)

    @property
    def fused_attention(self) -> bool:
        """As engine.device.GpuInfo.fused_attention: the plan gives the workspace no scores."""
        return runs_mma(self.capability)


@dataclass(frozen=True)
class PlanProblem:
    """Planning could not run (CPU mode, unreadable folder...): `reason` says why."""

    reason: str
    verdict_label: str = "Unknown"


def probe_gpu() -> Gpu | None:
    """The first NVIDIA GPU, or None (no driver, no card): NVML only, CUDA is not started."""
    info = engine_device.probe_gpu()
    if info is None:
        return None
    return Gpu(
        info.name,
        info.total_bytes,
        info.free_bytes,
        info.used_bytes,
        info.driver,
        info.speed,
        info.capability,
    )


def no_gpu_reason() -> str:
    return engine_device.no_gpu_reason() or "no NVIDIA driver or GPU was found"


def verdict_value(decision: Any) -> str:
    verdict = getattr(decision, "verdict", None)
    return str(getattr(verdict, "value", verdict) or "")


def verdict_label(decision: Any) -> str:
    if isinstance(decision, PlanProblem):
        return decision.verdict_label
    return VERDICT_LABELS.get(verdict_value(decision), verdict_value(decision).capitalize())


def breakdown_value(decision: Any, key: str) -> int:
    """One byte count from a decision's breakdown (a mapping or an object with attributes)."""
    breakdown = getattr(decision, "breakdown", None)
    if isinstance(breakdown, Mapping):
        value = breakdown.get(key, 0)
    else:
        value = getattr(breakdown, key, 0)
    return int(value or 0)


def shape_config(
    name: str, fmt: str, group_size: int, raw: Mapping[str, Any] | None
) -> ModelConfig:
    """The config of a catalog shape: the engine's table of Qwen3.5 sizes, or the catalog's
    own copy of the config for a size the engine does not list."""
    if name in shapes.SHAPES or raw is None:
        return shapes.shape_config(name, fmt, group_size)
    return parse_config(dict(raw), source=f"catalog shape {name}")


def model_specs(
    model_dir: str | None, shape: tuple[ModelConfig, str, int] | None
) -> tuple[ModelConfig, dict[str, TensorSpec]]:
    """The config and tensor specs the planners read: of a checkpoint on disk (its headers)
    or of a catalog shape (config, format, group size). ValueError when given neither."""
    if model_dir is not None:
        config, pairs = _checkpoint_specs(str(model_dir))
        return config, dict(pairs)
    if shape is not None:
        return shape[0], shapes.shape_tensor_specs(*shape)
    raise ValueError("planning needs a model folder or a catalog shape")


@lru_cache(maxsize=32)
def _checkpoint_specs(model_dir: str) -> tuple[ModelConfig, tuple[tuple[str, TensorSpec], ...]]:
    from engine.checkpoint import Checkpoint

    ckpt = Checkpoint.open(model_dir)
    return ckpt.config, tuple(checkpoint_specs(ckpt).items())


def plan(
    *,
    gpu: Gpu | None,
    settings: EngineSettings,
    context: int,
    streams: int,
    max_rows: int | None,
    model_dir: str | None = None,
    shape: tuple[ModelConfig, str, int] | None = None,
    held: int = 0,
) -> Any:
    """A Decision from engine.memory, or a PlanProblem saying why there is none.

    Give either `model_dir` (a checkpoint on disk) or `shape` (config, format, group size)
    for a catalog entry that is not downloaded. `held` is what the loaded model holds now;
    it is counted as free, since loading another model unloads it first.
    """
    if gpu is None:
        return PlanProblem(f"CPU mode: {no_gpu_reason()}; the model runs on the CPU.", "CPU mode")
    try:
        config, specs = model_specs(model_dir, shape)
        free = min(gpu.total_bytes, gpu.free_bytes + held)
        card = Card(gpu.total_bytes, free, speed=gpu.speed, fused_attention=gpu.fused_attention)
        return memory.decide(
            specs, config, settings, card, context=context, streams=streams, max_rows=max_rows
        )
    except Exception as exc:  # unreadable folder, bad config, planner errors
        return PlanProblem(f"{type(exc).__name__}: {exc}", "Cannot plan")


def fmt_bytes(n: float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB", "MiB") else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
