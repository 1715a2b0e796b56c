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
