"""What the decode step's DeltaNet and attention launches bring toward L2
(`launch.byte_span`, `launch.ahead_spans`): the kernels' (pointer, bytes) arguments, worked
out without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda import launch
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.weights import QWeight
from engine.errors import ConfigError

H200_L2 = 60 * 1000 * 1000


class _Dev:
    """An array's device side as the spans read it: a pointer and a size."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.data = type("P", (), {"ptr": ptr})()
        self.nbytes = nbytes


@pytest.fixture(autouse=True)
def _h200(monkeypatch):
    monkeypatch.setattr(launch, "l2_bytes", lambda: H200_L2)


def test_byte_span_covers_codes_scales_and_biases():
    w = type("W", (), {})()
    # Carved one after another, codes first; the span ends on a 16-byte multiple.
    w.packed, w.scales, w.biases = _Dev(4096, 1000), _Dev(5120, 200), _Dev(5376, 203)
    ptr, n = launch.byte_span(w)
    assert (int(ptr), int(n)) == (4096, (5376 + 203 - 4096) // 16 * 16)
    assert ptr.dtype == np.uint64 and n.dtype == np.int64  # the kernel's pointer, long long
    ptr, n = launch.byte_span(None)
    assert (int(ptr), int(n)) == (0, 0)


def _qweight(base: int, codes: int) -> QWeight:
    # codes, then scales and biases an eighth of their size each, carved one after another
    return QWeight(
        _Dev(base, codes),
        _Dev(base + codes, codes // 8),
        _Dev(base + codes * 9 // 8, codes // 8),
        4,
        64,
        (1, 1),
    )


def _ints(args: tuple) -> list[int]:
    return [int(a) for a in args]


def test_all_of_out_proj_then_the_heads_of_gate_and_up_codes():
    out_proj, gate, up = _qweight(1 << 20, 8000), _qweight(1 << 24, 16000), _qweight(1 << 25, 16000)
    args = launch.ahead_spans((out_proj, gate, up), Tuning())
    assert _ints(args) == [1 << 20, 10000, 1 << 24, 4800, 1 << 25, 4800]
    assert [a.dtype for a in args] == [np.uint64, np.int64] * 3  # pointer, long long


def test_nothing_where_missing_or_dense():
    out_proj, gate = _qweight(1 << 20, 8000), _qweight(1 << 24, 16000)
    assert _ints(launch.ahead_spans((out_proj,), Tuning())) == [1 << 20, 10000, 0, 0, 0, 0]
    dense = object()  # a bf16 checkpoint's weight: nothing of it is prefetched
    args = launch.ahead_spans((dense, gate, dense), Tuning())
    assert _ints(args) == [0, 0, 1 << 24, 4800, 0, 0]
    assert _ints(launch.ahead_spans((), Tuning())) == [0] * 6


def test_the_9b_spans_fit_an_h200s_share_and_a_small_l2_caps_them(monkeypatch):
    """The largest spans of the supported shapes (the 9B's 4-bit out_proj, 4096 x 4096
    with its scales and biases, and 30% of its gate's codes, 12288 x 4096) pass whole on an
    H200; a 4 MB L2 gets at most half of it per span."""
    codes = 4096 * 4096 // 2
    out_proj = _qweight(1 << 30, codes)
    gate = _qweight(1 << 31, 12288 * 4096 // 2)
    whole = launch.ahead_spans((out_proj, gate, gate), Tuning())
    assert _ints(whole)[1] == codes * 10 // 8 // 16 * 16
    assert _ints(whole)[3] == int(12288 * 4096 // 2 * 0.3) // 16 * 16
    monkeypatch.setattr(launch, "l2_bytes", lambda: 4 * 1000 * 1000)
    small = _ints(launch.ahead_spans((out_proj, gate, gate), Tuning()))
    assert small[1] == small[3] == small[5] == 2 * 1000 * 1000
    assert small[0::2] == _ints(whole)[0::2]  # the same starts


def test_tuning_values_are_checked():
    with pytest.raises(ConfigError, match="l2_mlp_fraction"):
        Tuning(l2_mlp_fraction=1.5)
    with pytest.raises(ConfigError, match="deltanet_step_blocks"):
        Tuning(deltanet_step_blocks=-1)
