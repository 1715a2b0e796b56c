"""gemv4's retiled last round (gemv4.cu, `Tuning.gemv_retile`): where the last round of
tiles would leave blocks idle, its tiles go to more blocks with more warps a tile. Every
variant, with and without it, at grids small enough that several rounds run and the last
is partial, against float32 references; every output row must be written."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda.gemv_plan import gemv4_blocks
from engine.backends.cuda.projections import Pro, Prologue
from engine.backends.numpy_backend import silu
from tests.device.test_fused import _norm_ref
from tests.device.test_kernels import TOL, _backend, _quant_weight, _rel, _round, _up


def _retiled(tiles: int, tpb: int, grid: int) -> bool:
    """Whether the kernel gives its last round fewer tiles a block (gemv4.cu's TP2 < TPB)."""
    vb = -(-tiles // tpb)
    full = vb // grid * grid
    left = tiles - full * tpb
    return full < vb and tpb > 1 and (tpb // 2) * grid >= left


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows", [1, 3])
def test_every_variant_retiled_and_not(dtype, rows):
    import cupy

    be = _backend(dtype)
    proj = be.projections
    rng = np.random.default_rng(90 + rows)
    retiled = 0
    for n_out, cols, swiglu, grid in [
        (1040, 1024, False, 16),  # 65 tiles: 64 in whole rounds, one left
        (1040, 1024, False, 24),  # 17 tiles left over 24 blocks
        (1048, 2048, False, 20),  # 66 tiles (the last part-filled)
        (520, 1024, True, 16),  # SwiGLU: tiles of 8 gate and 8 up rows
        (776, 2560, True, 36),
    ]:
        w, ref_w = _quant_weight(be, n_out, cols, 4, rng)
        up, ref_u = _quant_weight(be, n_out, cols, 4, rng) if swiglu else (None, None)
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        want = x @ ref_w.T
        if swiglu:
            want = silu(want) * (x @ ref_u.T)
        xd = _up(be, x)
        proj._gemv4_resident = lambda fn, threads, smem, g=grid: g
        for choice in proj.gemv_candidates(xd, w, up):
            tpb = choice[2]
            tiles = gemv4_blocks(n_out, swiglu, 1)
            for on in (False, True):
                proj.retile = on
                out = cupy.full((rows, n_out), 7, be.kernels.act_dtype)
                proj.gemv_run(choice, xd, w, out, up)
                got = be.to_host(out)
                where = (choice, n_out, cols, grid, on)
                assert np.isfinite(got).all(), where
                assert _rel(got, want) < TOL[dtype] * 2, where
            retiled += _retiled(tiles, tpb, min(grid, -(-tiles // tpb)))
    assert retiled >= 10


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_retiled_with_the_add_and_norm_prologue(dtype):
    """The prologue is every block's, whatever its tiles: the residual it stores and the
    products of a retiled last round match the references."""
    import cupy

    be = _backend(dtype)
    proj = be.projections
    rng = np.random.default_rng(7)
    eps, H, n_out = 1e-6, 2560, 1040
    w, ref_w = _quant_weight(be, n_out, H, 4, rng)
    x = _round(be, rng.standard_normal((1, H)).astype(np.float32))
    d = _round(be, rng.standard_normal((1, H)).astype(np.float32))
    nw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    u, h_ref = _norm_ref(be, x, d, nw, eps)
    xd, dd, nwd = _up(be, x), _up(be, d), cupy.asarray(nw)
    proj._gemv4_resident = lambda fn, threads, smem: 16
    proj.retile = True
    for choice in proj.gemv_candidates(xd, w, pro=Pro(Prologue.ADD_NORM, nwd, eps, delta=dd)):
        h = cupy.zeros((1, H), be.kernels.act_dtype)
        out = cupy.full((1, n_out), 7, be.kernels.act_dtype)
        proj.gemv_run(choice, xd, w, out, pro=Pro(Prologue.ADD_NORM, nwd, eps, delta=dd, h=h))
        assert np.array_equal(be.to_host(h), h_ref), choice
        assert _rel(be.to_host(out), u @ ref_w.T) < TOL[dtype], choice
