"""Device tests: skipped as a whole when CuPy cannot see an NVIDIA GPU (CI has none)."""

from __future__ import annotations

import pytest


def _device_reason() -> str | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CUDA reports no device"
        cupy.cuda.runtime.getDeviceProperties(0)
    except Exception as exc:  # ImportError or CUDARuntimeError: no usable GPU here
        return f"no usable GPU ({type(exc).__name__})"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _device_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "tests/device" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    from engine.testing.synth import write_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    return {fmt: write_checkpoint(root / fmt, "tiny", fmt, seed=3) for fmt in ("mlx4", "bf16")}
