"""The ctypes side of programmatic dependent launch (engine/backends/cuda/launch.py), which
runs without a GPU: structure layouts as cuda.h defines them, and argument marshalling."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.backends.cuda import launch


def test_structures_match_the_driver_abi():
    # CUlaunchAttribute: 4-byte id, 4 bytes of padding, a 64-byte value union.
    assert ctypes.sizeof(launch._Attr) == 72
    # CUlaunchConfig: 7 unsigned ints, then the stream and attribute pointers, the count.
    assert ctypes.sizeof(launch._Config) == 56
    assert launch._Config.stream.offset == 32 and launch._Config.attrs.offset == 40
    assert launch._Config.n_attrs.offset == 48


def test_scalars_keep_their_width_and_untyped_values_are_refused():
    assert isinstance(launch._param(np.int32(3)), ctypes.c_int32)
    assert isinstance(launch._param(np.float32(0.5)), ctypes.c_float)
    assert isinstance(launch._param(np.uint64(0)), ctypes.c_uint64)
    assert launch._param(np.float64(0.25)).value == 0.25
    with pytest.raises(TypeError, match="sized numpy scalar"):
        launch._param(3)  # a Python int has no width: it must not be guessed


class _FakeStream:
    current = None

    def __init__(self, name: str) -> None:
        self.name = name

    def use(self) -> _FakeStream:
        _FakeStream.current = self
        return self


def test_on_stream_makes_the_previous_stream_current_again(monkeypatch):
    import cupy

    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: _FakeStream.current)
    backend, timing = _FakeStream("backend").use(), _FakeStream("timing")
    with launch.on_stream(timing) as s:
        assert s is timing and _FakeStream.current is timing
    assert _FakeStream.current is backend
    with pytest.raises(RuntimeError), launch.on_stream(timing):
        raise RuntimeError("a failed capture")
    assert _FakeStream.current is backend


def test_no_code_uses_cupys_stream_context_manager():
    """CuPy's `with stream:` leaves the legacy default stream current afterwards (unordered
    with the backend's stream): the engine and the tools switch streams with on_stream."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"^\s*with\s+[\w.]*stream\w*\s*(:|,)", re.IGNORECASE | re.MULTILINE)
    offenders = [
        f"{path.relative_to(root)}: {m.group(0).strip()}"
        for folder in ("engine", "tools", "app")
        for path in (root / folder).rglob("*.py")
        for m in pattern.finditer(path.read_text())
    ]
    assert not offenders, offenders


def test_device_properties_are_read_once_and_set_the_launch_geometry(monkeypatch):
    """SM count, L2 and shared memory come from the device's properties, asked once a
    device: on an H200's numbers the grid-stride kernels get 16 blocks an SM (2112)."""
    import cupy

    asked = []

    def props(dev):
        asked.append(dev)
        return {
            "multiProcessorCount": 132,
            "l2CacheSize": 60_000_000,
            "sharedMemPerBlockOptin": 232448,
        }

    class _Device:
        id = 7

    monkeypatch.setattr(cupy.cuda, "Device", _Device)
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceProperties", props)
    monkeypatch.setattr(launch, "_PROPERTIES", {})
    assert (launch.sm_count(), launch.l2_bytes(), launch.smem_per_block()) == (
        132,
        60_000_000,
        232448,
    )
    assert launch.grid_cap() == 132 * 16
    assert asked == [7]
