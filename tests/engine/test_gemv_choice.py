"""Which projection kernel a GPU may run, decided without one: the tensor-core kernel
(gemv4) needs compute capability 8.0, so older cards get the SIMT kernel and separate norm
kernels instead of a module that cannot compile. gemv4 reads 4-bit weights in 8-row blocks
and the SIMT kernel in MLX's row order, so a matrix's order decides its kernel."""

from __future__ import annotations

import numpy as np

from engine.backends.cuda.gemv import GemvMixin
from engine.backends.cuda.weights import QWeight


class _Ops(GemvMixin):
    def __init__(self, dtype: str, mma_ok: bool) -> None:
        self.dtype = dtype
        self._smem_optin = 227 * 1024  # as the device would report; no CUDA call is made
        self._mma_ok = mma_ok
        self.variant_filter = None


def _weight(out: int = 256, cols: int = 2560, blocked: bool = True) -> QWeight:
    packed = np.zeros((out, cols // 8), np.uint32)
    sb = np.zeros((out, cols // 64), np.uint16)
    return QWeight(packed, sb, sb, 4, 64, (out, cols), blocked=blocked)


class _X:
    shape = (1, 2560)


def test_cards_before_ampere_do_not_get_the_tensor_core_kernel():
    assert _Ops("float16", mma_ok=True).blocks_ok(4, 64, 2560)
    assert _Ops("float16", mma_ok=True)._gemv4_ok(_X(), _weight())
    old = _Ops("float16", mma_ok=False)
    assert not old.blocks_ok(4, 64, 2560)  # so its weights stay in row order
    w = _weight(blocked=False)
    assert not old._gemv4_ok(_X(), w)
    assert not old.pro_ok(_X(), w, 1)  # the add + norm runs as its own kernel
    cands = old.gemv_candidates(_X(), w)
    assert cands and all(c[0] == "old" for c in cands)


def test_fp32_and_other_group_sizes_never_get_it():
    assert not _Ops("float32", mma_ok=True).blocks_ok(4, 64, 2560)
    assert not _Ops("float32", mma_ok=True)._gemv4_ok(_X(), _weight(blocked=False))
    for bits, group in ((4, 32), (8, 64), (2, 64)):
        assert not _Ops("bfloat16", mma_ok=True).blocks_ok(bits, group, 2560)
    # rows too wide for gemv4's staged input or for one block's rearrangement stay in order
    assert not _Ops("bfloat16", mma_ok=True).blocks_ok(4, 64, 65536)


def test_each_order_gets_only_the_kernel_that_reads_it():
    ops = _Ops("bfloat16", mma_ok=True)
    blocked = ops.gemv_candidates(_X(), _weight())
    assert blocked and all(c[0] == "mma" for c in blocked)
    rows = ops.gemv_candidates(_X(), _weight(blocked=False))
    assert rows and all(c[0] == "old" for c in rows)
    assert not ops.pro_ok(_X(), _weight(blocked=False), 1)
    assert ops.gemv_ok(_weight(), 8) and not ops.gemv_ok(_weight(), 9)


def test_step_tuning_tries_the_fastest_alone_and_every_variant_requested_at_once():
    """The decode step's own tuning (DecodeGraphs.tune) takes the `keep` fastest alone, then
    the tensor-core variants that request a warp's whole slice before the wait (neither
    pipelined nor staged), once each; the SIMT kernel has no such family."""
    ops = _Ops("bfloat16", mma_ok=True)
    ranked = ops.gemv_candidates(_X(), _weight())
    at_once = [c for c in ranked if not c[4] and not c[5]]
    assert at_once and len(at_once) < len(ranked)
    ops.gemv_ranked = {"k": ranked[::-1]}  # the at-once ones now rank first or last alike
    cands = ops.step_candidates("k", 3)
    assert cands[:3] == ranked[::-1][:3]
    assert set(cands) == set(ranked[::-1][:3]) | set(at_once)
    assert len(cands) == len(set(cands))
    assert ops.step_candidates("k", 0) == [c for c in ranked[::-1] if c in at_once]
    assert ops.step_candidates("k", None) == ranked[::-1]
    assert ops.step_candidates("missing", 3) == []
    old = ops.gemv_candidates(_X(), _weight(blocked=False))
    ops.gemv_ranked = {"old": old}
    assert ops.step_candidates("old", 2) == old[:2]
