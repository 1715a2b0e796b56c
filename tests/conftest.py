"""Shared fixtures: tiny random Qwen3.5 checkpoints, built once per test session."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

TinyCheckpoint = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> TinyCheckpoint:
    """`tiny_checkpoint(preset="tied-l4-r1", fmt="hf-fp32", shards=1) -> Path`.

    Presets are `engine.testing.tiny.TINY_PRESETS`; formats hf-fp32, hf-bf16, mlx4-g64,
    mlx4-g32, mlx8-g64. Each combination is built on first request and reused for the session.
    Treat the folders as read-only.
    """
    from engine.testing.tiny import build_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    built: dict[tuple[str, str, int], Path] = {}

    def get(preset: str = "tied-l4-r1", fmt: str = "hf-fp32", shards: int = 1) -> Path:
        key = (preset, fmt, shards)
        if key not in built:
            out = root / f"{preset}-{fmt}" if shards == 1 else root / f"{preset}-{fmt}-s{shards}"
            built[key] = build_checkpoint(preset, fmt, out, shards=shards)
        return built[key]

    return get
