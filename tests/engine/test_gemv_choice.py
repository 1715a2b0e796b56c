"""Which projection kernel a GPU may run, decided without one: the tensor-core kernel
(gemv4) needs compute capability 8.0, so older cards get the SIMT kernel and separate norm
kernels instead of a module that cannot compile."""

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


def _weight(out: int = 256, cols: int = 2560) -> QWeight:
    packed = np.zeros((out, cols // 8), np.uint32)
    sb = np.zeros((out, cols // 64), np.uint16)
    return QWeight(packed, sb, sb, 4, 64, (out, cols))


class _X:
    shape = (1, 2560)


def test_cards_before_ampere_do_not_get_the_tensor_core_kernel():
    w = _weight()
    assert _Ops("float16", mma_ok=True)._gemv4_ok(_X(), w)
    old = _Ops("float16", mma_ok=False)
    assert not old._gemv4_ok(_X(), w)
    assert not old.pro_ok(_X(), w, 1)  # the add + norm runs as its own kernel
    cands = old.gemv_candidates(_X(), w)
    assert cands and all(c[0] == "old" for c in cands)


def test_fp32_and_other_group_sizes_never_get_it():
    assert not _Ops("float32", mma_ok=True)._gemv4_ok(_X(), _weight())
    w = _weight()
    w.group_size = 32
    assert not _Ops("bfloat16", mma_ok=True)._gemv4_ok(_X(), w)
