"""The arithmetic of `tools/profile_step.py --stamps` on records built by hand (the records
themselves come from a GPU: the device runs)."""

import numpy as np

from tools.profile_step import stamp_kernels, stamp_label, stamp_phases, stamp_variant


def _record(w, out, cols, flags, block, t):
    return [w, (out << 32) | cols, (flags << 40) | block, *t]


def test_launches_are_ordered_and_their_phases_measured_from_the_previous_exit():
    recs = np.array(
        [
            # second projection (2560x4096, prologue 2), two blocks, listed first
            # clocks: entry, wait return, staged, first tile, exit, staging start, first entry
            _record(200, 2560, 4096, 2, 0, [900, 1100, 1500, 2500, 3000, 1200, 1400]),
            _record(200, 2560, 4096, 2, 1, [950, 1100, 1700, 2700, 3400, 1300, 1500]),
            # first projection (9216x2560 SwiGLU, prologue 1), one block
            _record(100, 9216, 2560, 17, 0, [0, 100, 300, 600, 1000, 150, 200]),
        ],
        np.uint64,
    )
    ks = stamp_kernels(recs)
    assert [k["label"] for k in ks] == ["9216x2560 swiglu pro1", "2560x4096 pro2"]
    agg = stamp_phases(ks)
    assert list(agg) == ["2560x4096 pro2"]
    a = agg["2560x4096 pro2"]
    assert a["entry"] == [-100]  # entered before the first one's last exit at 1000
    assert a["release"] == [100]
    assert a["ready"] == [150]  # median 1250 - 1100
    assert a["loaded"] == [200]  # median 1450 - 1250
    assert a["stage"] == [500]  # median 1600 - 1100
    assert a["first"] == [1000]
    assert a["finish"] == [3400 - 2600]
    assert a["tail"] == [3400 - 3200]
    assert a["span"] == [2400]
    assert a["blocks"] == [2]
    assert stamp_label(2560, 9216, 0) == "2560x9216"


def test_the_variant_is_read_from_the_flags():
    # a SwiGLU add + norm at 640 threads (20 warps), 2 tiles a block: 10 warps a tile
    flags = 16 | 1 | (2 << 6) | (8 << 12) | (20 << 16)
    assert stamp_label(9216, 2560, flags) == "9216x2560 swiglu pro1"
    assert stamp_variant(flags) == "10/2/8, 640 thr"
    assert stamp_variant(32 | (1 << 6) | (2 << 12) | (16 << 16)) == "16/1/2p, 512 thr"
    recs = np.array(
        [_record(7, 1024, 2048, 5 | (4 << 6) | (4 << 12) | (8 << 16), 0, [0] * 7)], np.uint64
    )
    assert stamp_kernels(recs)[0]["variant"] == "2/4/4, 256 thr"
