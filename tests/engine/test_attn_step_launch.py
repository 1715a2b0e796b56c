"""A decode step's attention with attn_prep's work in it (attn_decode_prep), without a GPU:
the instance it asks for, the parameters it passes (exactly those the kernel declares, in
order), and where its shared memory fits. tests/device/test_attn_step.py runs it."""

from __future__ import annotations

from engine.backends.cuda.attention import (
    STATIC_SMEM,
    Attention,
    decode_kernel,
    decode_smem,
    step_prep_fits,
)
from engine.backends.cuda.tuning import Tuning
from tests.engine.cuda_fakes import DeviceArray, RecordingKernels
from tests.engine.test_kv_int8_launches import _params


def test_decode_prep_passes_what_the_kernel_declares(monkeypatch):
    monkeypatch.setattr("engine.backends.cuda.attention.sm_count", lambda: 0)  # 4 warps
    k = RecordingKernels()
    at = Attention(k, None, None, Tuning())
    q, kc, vc, qg, kk, v = (DeviceArray((2, 8)) for _ in range(6))
    heads = (16, 4, 256)
    inputs = (qg, kk, v, "qn", "kn", 64, 1e7, 1e-6)
    at.decode_prep(q, kc, vc, "pos", "slot", "po", "pml", heads, 8192, 32, 128, inputs, ())
    sym, grid, block, _, args = k.launches[-1]
    assert sym == decode_kernel(4, 256, 128, 4, 2, 0, prep=True)[0] == "attn_decode_prep<8,4,4,4>"
    assert (grid, block) == ((128, 4, 2), (128,))
    names = _params("attn_decode_prep")
    assert len(args) == len(names)
    assert names[:11] == ["qg", "k", "v", "qn", "kn", "kc", "vc", "pos", "row_slot", "po", "pml"]
    assert args[:11] == (qg, kk, v, "qn", "kn", kc, vc, "pos", "slot", "po", "pml")
    assert [int(x) for x in args[11:16]] == [16, 4, 8192, 32, 128]
    assert names[17:20] == ["rot", "theta", "eps"] and int(args[17]) == 64
    assert names[20:] == ["ahead", "ahead_bytes", "ahead2", "bytes2", "ahead3", "bytes3"]


def test_where_the_step_prep_fits():
    """attn_decode's partials plus the RoPE factors and norm weights (16 bytes a dim) in 48
    KiB of static shared memory, at every warp count the step may run with."""
    assert step_prep_fits(4, 256) and step_prep_fits(8, 256) and step_prep_fits(1, 128)
    assert step_prep_fits(4, 384)  # 4 warps only at that width: 30,848 bytes
    # A width the plain step runs (41,088 bytes of partials) but not with the prep's 10,240
    assert decode_smem(4, 640, 4) <= STATIC_SMEM and not step_prep_fits(4, 640)
