"""gemv_tc's launches without a GPU: one block a tile of 16 output rows (SwiGLU: 8), the
warps as the variant says, and exactly the parameters gemv_tc.cu declares, in order.
tests/device/test_gemv_tc.py runs the kernel against numpy."""

from __future__ import annotations

import re

from engine.backends.cuda.gemv_tc import tc_launch, tc_symbol
from engine.backends.cuda.modules import source
from tests.engine.cuda_fakes import DeviceArray, RecordingKernels


class _W:
    def __init__(self, out: int, cols: int) -> None:
        self.shape = (out, cols)
        self.data = DeviceArray((out, cols))


def _params() -> list[str]:
    head = re.search(r"\bgemv_tc\(([^)]*)\)\s*{", source("gemv_tc.cu"))
    assert head
    return [p.split()[-1].lstrip("*") for p in head.group(1).split(",")]


def test_a_tile_a_block_and_every_parameter_in_order():
    k = RecordingKernels()
    x, out, w = DeviceArray((3, 2560)), DeviceArray((3, 4100)), _W(4100, 2560)
    tc_launch(k, x, w, out, None, 8)
    sym, grid, block, smem, args = k.launches[-1]
    assert sym == tc_symbol(3, False) == "gemv_tc<3,false,4>"
    assert grid == (257,) and block == (256,) and smem == 0  # 4100 rows: 256 tiles and a part
    names = _params()
    assert names == ["W0", "W1", "X", "ldx", "Y", "ldy", "out", "in"]
    assert len(args) == len(names) and args[0] is w.data and args[1] is w.data
    assert [int(a) for a in (args[3], args[5], args[6], args[7])] == [2560, 4100, 4100, 2560]


def test_swiglu_takes_8_gate_rows_over_the_same_8_up_rows():
    k = RecordingKernels()
    gate, up = _W(9216, 2560), _W(9216, 2560)
    tc_launch(k, DeviceArray((2, 2560)), gate, DeviceArray((2, 9216)), up, 4)
    sym, grid, block, _, args = k.launches[-1]
    assert sym == "gemv_tc<2,true,4>" and grid == (1152,) and block == (128,)
    assert args[0] is gate.data and args[1] is up.data
