"""Which projection kernel a GPU may run, decided without one: the tensor-core kernel
(gemv4) needs compute capability 8.0, so older cards get the SIMT kernel and separate norm
kernels instead of a module that cannot compile. gemv4 reads 4-bit weights in 8-row blocks
and the SIMT kernel in MLX's row order, so a matrix's order decides its kernel."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda import projections
from engine.backends.cuda.projection_tuning import ProjectionTuner
from engine.backends.cuda.projections import GEMV4_VARIANTS, Projections, Prologue
from engine.backends.cuda.weights import QWeight


class _Kernels:
    """What Projections reads of its launcher; nothing here reaches CUDA."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.act_itemsize = 4 if dtype == "float32" else 2


@pytest.fixture(autouse=True)
def _h200(monkeypatch):
    """The device properties as an H200 reports them; no CUDA call is made."""
    monkeypatch.setattr(projections, "smem_per_block", lambda: 227 * 1024)
    monkeypatch.setattr(projections, "compute_capability", lambda: 90)


def _proj(dtype: str, mma_ok: bool = True) -> Projections:
    p = Projections(_Kernels(dtype))
    p._mma_ok = mma_ok
    return p


def _weight(out: int = 256, cols: int = 2560, blocked: bool = True) -> QWeight:
    packed = np.zeros((out, cols // 8), np.uint32)
    sb = np.zeros((out, cols // 64), np.uint16)
    return QWeight(packed, sb, sb, 4, 64, (out, cols), blocked=blocked)


class _X:
    shape = (1, 2560)


def test_cards_before_ampere_do_not_get_the_tensor_core_kernel(monkeypatch):
    assert _proj("float16").blocks_ok(4, 64, 2560)
    assert _proj("float16")._gemv4_ok(_X(), _weight())
    monkeypatch.setattr(projections, "compute_capability", lambda: 75)
    old = Projections(_Kernels("float16"))  # asks the device, as a backend does
    assert not old.blocks_ok(4, 64, 2560)  # so its weights stay in row order
    w = _weight(blocked=False)
    assert not old._gemv4_ok(_X(), w)
    assert not old.pro_ok(_X(), w, Prologue.ADD_NORM)  # the add + norm runs as its own kernel
    cands = old.gemv_candidates(_X(), w)
    assert cands and all(c[0] == "old" for c in cands)


def test_fp32_and_other_group_sizes_never_get_it():
    assert not _proj("float32").blocks_ok(4, 64, 2560)
    assert not _proj("float32")._gemv4_ok(_X(), _weight(blocked=False))
    for bits, group in ((4, 32), (8, 64), (2, 64)):
        assert not _proj("bfloat16").blocks_ok(bits, group, 2560)
    # rows too wide for gemv4's staged input or for one block's rearrangement stay in order
    assert not _proj("bfloat16").blocks_ok(4, 64, 65536)


def test_a_smaller_shared_memory_narrows_what_is_blocked(monkeypatch):
    """The shared memory a block may opt in to comes from the device: an 8-row block of 32K
    columns (128 KiB to rearrange) fits an H200's 227 KiB but not 99 KiB (a consumer
    card's); 16K columns fit both (gemv4's smaller variants stage one row of them)."""
    assert _proj("bfloat16").blocks_ok(4, 64, 32768)
    monkeypatch.setattr(projections, "smem_per_block", lambda: 99 * 1024)
    assert not _proj("bfloat16").blocks_ok(4, 64, 32768)
    assert _proj("bfloat16").blocks_ok(4, 64, 16384)
    assert _proj("bfloat16").blocks_ok(4, 64, 2560)


def test_each_order_gets_only_the_kernel_that_reads_it():
    p = _proj("bfloat16")
    blocked = p.gemv_candidates(_X(), _weight())
    assert blocked == [("mma", *v) for v in GEMV4_VARIANTS]
    rows = p.gemv_candidates(_X(), _weight(blocked=False))
    assert rows and all(c[0] == "old" for c in rows)
    assert not p.pro_ok(_X(), _weight(blocked=False), Prologue.ADD_NORM)
    assert p.gemv_ok(_weight(), 8) and not p.gemv_ok(_weight(), 9)


def test_prologue_kinds_are_the_kernels_template_arguments():
    """The values gemv4.cu's PRO takes; a choice key holds the plain integer."""
    assert [int(k) for k in Prologue] == [0, 1, 2, 5]
    sym = Projections.gemv4_symbol(1, False, GEMV4_VARIANTS[0], Prologue.GATED_NORM_FOLDED)
    assert sym == "gemv4<1,false,2,2,true,256,5,false>"
    pro = projections.Pro(Prologue.ADD_NORM, None, 1e-6)
    key = Projections.gemv_key(np.zeros((1, 2560)), _weight(), pro=pro)
    assert key == (4, 1, 256, 2560, False, 1, True) and type(key[5]) is int


def test_step_tuning_tries_the_fastest_alone_and_every_variant_requested_at_once():
    """The decode step's own tuning (DecodeGraphs.tune) takes the `keep` fastest alone, then
    the tensor-core variants that request a warp's whole slice before the wait (not
    pipelined), once each; the SIMT kernel has no such family."""
    p = _proj("bfloat16")
    ranked = p.gemv_candidates(_X(), _weight())
    at_once = [c for c in ranked if not c[4]]
    assert at_once and len(at_once) < len(ranked)
    tuner = ProjectionTuner("test")
    tuner.ranked = {"k": ranked[::-1]}  # the at-once ones now rank first or last alike
    cands = tuner.step_candidates("k", 3)
    assert cands[:3] == ranked[::-1][:3]
    assert set(cands) == set(ranked[::-1][:3]) | set(at_once)
    assert len(cands) == len(set(cands))
    assert tuner.step_candidates("k", 0) == [c for c in ranked[::-1] if c in at_once]
    assert tuner.step_candidates("k", None) == ranked[::-1]
    assert tuner.step_candidates("missing", 3) == []
    old = p.gemv_candidates(_X(), _weight(blocked=False))
    tuner.ranked = {"old": old}
    assert tuner.step_candidates("old", 2) == old[:2]


def _dense(out: int = 256, cols: int = 2560):
    from engine.backends.cuda.weights import DWeight

    return DWeight(np.zeros((out, cols), np.float16), (out, cols))


def test_dense_matrices_offer_the_tensor_core_kernel_beside_the_simt_one(monkeypatch):
    """gemv_tc joins the candidates for a dense matrix in 16-bit activations from sm_80,
    after the SIMT variants (the first candidate is what a capture takes untimed); never in
    fp32, before sm_80, for a width that is not a multiple of 32, or batch-invariant."""
    from engine.backends.cuda.gemv_tc import TC_WARPS

    x = np.zeros((3, 2560), np.float16)
    for dtype in ("bfloat16", "float16"):
        cands = _proj(dtype).gemv_candidates(x, _dense())
        assert cands[0][0] == "old" and [c for c in cands if c[0] == "tc"] == [
            ("tc", w) for w in TC_WARPS
        ]
        swiglu = _proj(dtype).gemv_candidates(x, _dense(), up=_dense())
        assert ("tc", TC_WARPS[0]) in swiglu
    assert all(c[0] == "old" for c in _proj("float32").gemv_candidates(x, _dense()))
    assert all(c[0] == "old" for c in _proj("bfloat16").gemv_candidates(x, _dense(cols=2576)))
    invariant = _proj("bfloat16")
    invariant.invariant = True
    assert all(c[0] == "old" for c in invariant.gemv_candidates(x, _dense()))
    monkeypatch.setattr(projections, "compute_capability", lambda: 75)
    assert all(c[0] == "old" for c in _proj("float16").gemv_candidates(x, _dense()))
