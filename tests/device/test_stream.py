"""The streamed projection kernel (gemv4s.cu: a producer warp copies weights into shared
memory while consumer warps compute) against numpy, with every prologue, on odd sizes, and
in a chain of overlapped launches inside a CUDA graph, where each block lets the next kernel
start before it has finished."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_backend import silu
from tests.device.test_fused import HALF, _gated_ref, _norm_ref
from tests.device.test_kernels import TOL, _backend, _quant_weight, _rel, _round, _up


def _ws(be, x, w, up=None):
    from engine.backends.cuda.gemv import GEMV4S_VARIANTS

    return [("ws", *v) for v in GEMV4S_VARIANTS if be.ops._gemv4s_plan(x, w, up, v)]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_streamed_projection(dtype, rows):
    """Plain and SwiGLU products; a row count that ends inside a tile; one tile; more tiles
    than blocks; inputs of 512 columns (one 8-group chunk) to 9216 (several chunks)."""
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(rows)
    shapes = [(300, 2560, False), (16, 512, False), (12352, 2560, False)]
    shapes += [(2560, 9216, False), (1000, 1536, True), (9216, 2560, True)]
    tested = 0
    for n_out, cols, swiglu in shapes:
        w, ref_w = _quant_weight(be, n_out, cols, 4, rng)
        up, ref_u = _quant_weight(be, n_out, cols, 4, rng) if swiglu else (None, None)
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        want = x @ ref_w.T
        if swiglu:
            want = silu(want) * (x @ ref_u.T)
        xd = _up(be, x)
        for choice in _ws(be, xd, w, up):  # none where the staged input leaves no room
            tested += 1
            buf = cupy.full(rows * n_out + 8, 7, be.ops.act_dtype)
            out = buf[: rows * n_out].reshape(rows, n_out)
            be.ops.gemv_run(choice, xd, w, out, up)
            assert (buf[rows * n_out :].get() == 7).all(), ("wrote past the output", choice)
            got = be.to_host(out)
            assert _rel(got, want) < TOL[dtype] * 2, (choice, n_out, cols, swiglu)
    assert tested >= 10


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 5])
def test_streamed_prologues(dtype, rows):
    """Residual add + RMSNorm (storing the sum) and the DeltaNet gated per-head norm."""
    import cupy

    from engine.backends.cuda.gemv import Pro

    be = _backend(dtype)
    rng = np.random.default_rng(40 + rows)
    eps = 1e-6
    H, n_out = 2560, 1200
    w, ref_w = _quant_weight(be, n_out, H, 4, rng)
    x = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
    d = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
    nw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    xd = _up(be, x)
    u, h_ref = _norm_ref(be, x, d, nw, eps)
    for choice in _ws(be, xd, w):
        h = cupy.zeros((rows, H), be.ops.act_dtype)
        out = cupy.empty((rows, n_out), be.ops.act_dtype)
        pro = Pro(1, cupy.asarray(nw), eps, delta=_up(be, d), h=h)
        be.ops.gemv_run(choice, xd, w, out, pro=pro)
        assert np.array_equal(be.to_host(h), h_ref), choice
        assert _rel(be.to_host(out), u @ ref_w.T) < TOL[dtype], choice

    Hv, dv = 32, 128
    VD = Hv * dv
    w, ref_w = _quant_weight(be, H, VD, 4, rng)
    o = rng.standard_normal((rows, VD)).astype(np.float32)
    z = _round(be, rng.standard_normal((rows, VD)).astype(np.float32))
    nw = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    y = _gated_ref(be, o, z, nw, dv, eps)
    zd = _up(be, z)
    for choice in _ws(be, zd, w):
        out = cupy.empty((rows, H), be.ops.act_dtype)
        pro = Pro(2, cupy.asarray(nw), eps, o=cupy.asarray(o), head_dim=dv)
        be.ops.gemv_run(choice, zd, w, out, pro=pro)
        assert _rel(be.to_host(out), y @ ref_w.T) < TOL[dtype], choice


def test_streamed_chain_in_a_graph_equals_eager():
    """Twelve projections, each reading the one before, with overlapped launches in a graph:
    the next kernel's producers start while this one computes, and its consumers must still
    see every output of the previous one. Bit-equal to the same launches run eagerly."""
    import cupy

    from engine.backends.cuda.launch import on_stream

    be = _backend("bfloat16")
    rng = np.random.default_rng(5)
    dims = [2560, 9216, 2560, 4096, 2560] * 3
    ws = [_quant_weight(be, dims[i + 1], dims[i], 4, rng)[0] for i in range(12)]
    x0 = _up(be, rng.standard_normal((1, dims[0])).astype(np.float32))
    bufs = [cupy.zeros((1, d), be.ops.act_dtype) for d in dims[1:13]]

    def chain(choice_of):
        src = x0
        for w, dst in zip(ws, bufs, strict=True):
            be.ops.gemv_run(choice_of(src, w), src, w, dst)
            src = dst

    variants = [lambda x, w: _ws(be, x, w)[0], lambda x, w: _ws(be, x, w)[-1]]
    for pick in variants:
        chain(pick)
        cupy.cuda.get_current_stream().synchronize()
        eager = [b.get() for b in bufs]
        for b in bufs:
            b.fill(0)
        stream = cupy.cuda.Stream(non_blocking=True)
        with on_stream(stream):
            be.ops.graphing = True
            try:
                stream.begin_capture()
                chain(pick)
                graph = stream.end_capture()
            finally:
                be.ops.graphing = False
            for _ in range(3):
                graph.launch(stream)
            stream.synchronize()
        for i, b in enumerate(bufs):
            assert np.array_equal(b.get(), eager[i]), i
