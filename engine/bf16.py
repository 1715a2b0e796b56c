"""bfloat16 as raw bits: numpy has no bf16 type, so bf16 arrays are uint16 holding the top
half of a float32. One pair of helpers for the whole project; `xp` is numpy or CuPy."""

from __future__ import annotations

from typing import Any

import numpy as np


def to_bf16(x: Any, xp: Any = np) -> Any:
    """float32 -> bf16 bits (uint16), rounded to nearest even."""
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(xp.uint16)


def from_bf16(bits: Any, xp: Any = np) -> Any:
    """bf16 bits (uint16) -> float32: a bf16 is the top half of an f32."""
    return (bits.astype(xp.uint32) << 16).view(xp.float32)
