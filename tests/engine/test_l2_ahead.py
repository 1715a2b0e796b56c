"""What the decode step's DeltaNet launch brings toward L2 (`launch.byte_span`,
`Ops._ahead_spans`): the kernel's (pointer, bytes) arguments, worked out without a GPU."""

from __future__ import annotations

import numpy as np

from engine.backends.cuda import launch
from engine.backends.cuda.ops import Ops
from engine.backends.cuda.weights import QWeight


class _Dev:
    """An array's device side as the spans read it: a pointer and a size."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.data = type("P", (), {"ptr": ptr})()
        self.nbytes = nbytes


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


class _Ops:
    _ahead_spans = Ops._ahead_spans

    def __init__(self, on: bool = True, fraction: float = 0.3) -> None:
        self.l2_ahead, self.l2_mlp_fraction = on, fraction


def _ints(args: tuple) -> list[int]:
    return [int(a) for a in args]


def test_all_of_out_proj_then_the_heads_of_gate_and_up_codes():
    out_proj, gate, up = _qweight(1 << 20, 8000), _qweight(1 << 24, 16000), _qweight(1 << 25, 16000)
    args = _Ops()._ahead_spans((out_proj, gate, up))
    assert _ints(args) == [1 << 20, 10000, 1 << 24, 4800, 1 << 25, 4800]
    assert [a.dtype for a in args] == [np.uint64, np.int64] * 3  # pointer, long long


def test_nothing_when_off_missing_or_dense():
    out_proj, gate = _qweight(1 << 20, 8000), _qweight(1 << 24, 16000)
    assert _ints(_Ops(on=False)._ahead_spans((out_proj, gate, gate))) == [0] * 6
    assert _ints(_Ops()._ahead_spans((out_proj,))) == [1 << 20, 10000, 0, 0, 0, 0]
    dense = object()  # a bf16 checkpoint's weight: nothing of it is prefetched
    assert _ints(_Ops()._ahead_spans((dense, gate, dense))) == [0, 0, 1 << 24, 4800, 0, 0]
