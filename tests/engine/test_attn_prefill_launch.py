"""The fused prefill attention's launches without a GPU: the grid covers every query row and
head asked for, and the arguments are exactly the parameters attn_prefill.cu declares, in
order. tests/device/test_attn_prefill.py runs the kernel."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.backends.base import Segment
from engine.backends.cuda.attention import Attention
from engine.backends.cuda.tuning import Tuning
from tests.engine.cuda_fakes import RecordingKernels
from tests.engine.test_kv_int8_launches import _params


def test_flash_launch_matches_the_kernel():
    k = RecordingKernels()
    config = SimpleNamespace(num_attention_heads=16, num_key_value_heads=4, head_dim=256)
    at = Attention(k, None, SimpleNamespace(config=config), Tuning())
    at._fused = ("attn_prefill<256,4,2>", 101_376)
    seg = Segment(slot=1, start=300, rows=130)
    at.flash("q", "qg", "k", "v", "out", seg, 64, (0, 16, 8192 * 256))
    sym, grid, block, smem, args = k.launches[-1]
    assert (sym, grid, block, smem) == ("attn_prefill<256,4,2>", (3, 16), (128,), 101_376)
    names = _params("attn_prefill", "attn_prefill.cu")
    assert len(args) == len(names)
    assert names[:5] == ["q", "qg", "kc", "vc", "out"] and args[:5] == ("q", "qg", "k", "v", "out")
    ints = dict(zip(names[5:12], (int(a) for a in args[5:12]), strict=True))
    assert ints == dict(rows=130, row0=64, start=300, Hq=16, gq=4, h0=0, head_stride=8192 * 256)
    assert np.isclose(float(args[12]), 256**-0.5 * np.log2(np.e))
    at.flash("q", "qg", "k", "v", "out", seg, 64, (8, 4, 0))  # one KV head's copy (8-bit cache)
    _, grid, _, _, args = k.launches[-1]
    assert grid == (3, 4) and int(args[10]) == 8 and int(args[11]) == 0
