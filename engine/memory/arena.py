"""What the weights take on the card: the arena's bytes per tensor, from shapes alone.

The weights live in one device block (the arena) allocated at load and carved in order. This
module is the one place that sizes it, for a checkpoint on disk and for a catalog shape that
is not downloaded, so the load panel's preview, `snug plan` and `Engine.load` all plan with
the same bytes (`engine.memory.admission.decide`):

    quantized [out, in]   codes out8 * in * bits / 8, scales and biases out8 * in / group
                          each in the activation type (out8: rows rounded up to 8, the
                          decode kernel's 8-row blocks)
    small (1-D, norms,    fp32
      conv1d, A_log,
      dt_bias)
    dense [out, in]       the activation type

Every carve is rounded up to ALIGN bytes. `mtp.*` (the multi-token-prediction head) is
loaded only to draft with it (engine.memory.draft).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.config import EngineSettings
from engine.model_config import QuantSpec

ALIGN = 256  # bytes: every carve of the arena, the state blocks and the scratch starts here
SMALL_SUFFIXES = ("norm", "layernorm", "conv1d", "A_log", "dt_bias")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor as the planner sees it: its logical shape and, when quantized, how."""

    shape: tuple[int, ...]
    quant: QuantSpec | None = None


def padded(n: int) -> int:
    """`n` rounded up to ALIGN."""
    return (n + ALIGN - 1) // ALIGN * ALIGN


def rows8(n: int) -> int:
    """Rows rounded up to the decode kernel's 8-row blocks."""
    return (n + 7) // 8 * 8


def is_small(name: str, shape: tuple[int, ...]) -> bool:
    """Tensors kept in fp32 on the card (norms, conv1d, A_log, dt_bias: all small)."""
    return len(shape) == 1 or name.endswith(SMALL_SUFFIXES)


def act_itemsize(settings: EngineSettings) -> int:
    """Bytes per activation element for these settings (fp32 is the exactness mode; bf16
    and its fp16 fallback on older cards are both 2)."""
    return 4 if settings.compute_dtype == "float32" else 2


def checkpoint_specs(checkpoint: Any) -> dict[str, TensorSpec]:
    """The specs of a checkpoint on disk (`engine.checkpoint.Checkpoint`: headers only)."""
    return {
        name: TensorSpec(tuple(info.shape), info.quant) for name, info in checkpoint.tensors.items()
    }


def arena_bytes(
    specs: Mapping[str, TensorSpec], itemsize: int, mtp: bool = False
) -> dict[str, int]:
    """Arena bytes per tensor name (what the CUDA backend's upload carves); `mtp.*` only
    with `mtp` (drafting)."""
    sizes: dict[str, int] = {}
    for name, spec in specs.items():
        if name.startswith("mtp.") and not mtp:
            continue
        shape = spec.shape
        if spec.quant is not None:
            out, cols = rows8(shape[0]), shape[1]
            groups = cols // spec.quant.group_size
            codes = padded(out * cols * spec.quant.bits // 8)
            sizes[name] = codes + 2 * padded(out * groups * itemsize)
        elif is_small(name, shape):
            sizes[name] = padded(math.prod(shape) * 4)
        else:
            sizes[name] = padded(math.prod(shape) * itemsize)
    return sizes
