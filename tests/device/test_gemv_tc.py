"""The dense tensor-core decode product (kernels/gemv_tc.cu) against numpy, at every row
count 1 to 8, both variants, with and without SwiGLU, on widths that end inside a tile; and,
printed with -s, its time beside the SIMT kernel's at the 4B bf16 shapes a drafting verify
runs (kernel figures for the tuner's choice, not the product's speed)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda.gemv_tc import TC_WARPS, tc_launch
from engine.backends.cuda.launch import compute_capability
from engine.backends.cuda.weights import DWeight
from engine.backends.numpy_backend import silu
from tests.device.test_kernels import _backend, _rel, _round, _up

TOL = {"bfloat16": 1e-2, "float16": 2e-3}
SHAPES = [(8, 32), (200, 96), (4100, 2560)]  # (out, in): out past whole tiles


@pytest.fixture(autouse=True)
def _needs_mma():
    if compute_capability() < 80:
        pytest.skip("gemv_tc runs on sm_80 and newer")


def _dense(be, out, cols, rng):
    w = _round(be, rng.standard_normal((out, cols)).astype(np.float32) / np.sqrt(cols))
    return DWeight(_up(be, w), (out, cols)), w


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("swiglu", [False, True])
def test_gemv_tc_matches_numpy(dtype, shape, swiglu):
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(7)
    out, cols = shape
    w, ref = _dense(be, out, cols, rng)
    up, ref_up = _dense(be, out, cols, rng) if swiglu else (None, None)
    for rows in range(1, 9):
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        want = x @ ref.T
        if swiglu:
            want = silu(want) * (x @ ref_up.T)
        for warps in TC_WARPS:
            y = cupy.full((rows, out), 7, be.kernels.act_dtype)
            tc_launch(be.kernels, _up(be, x), w, y, up, warps)
            got = be.to_host(y).astype(np.float32)
            assert _rel(got, want) < TOL[dtype], (rows, warps)


def test_gemv_tc_beside_the_simt_kernel(capsys):
    """4B bf16 shapes at 1 to 4 rows: the same values as the SIMT kernel to rounding, and
    both times printed."""
    import cupy

    be = _backend("bfloat16")
    rng = np.random.default_rng(0)
    shapes = {"down": (2560, 9216), "gate/up": (9216, 2560), "o_proj": (2560, 4096)}
    lines = []
    for name, (out, cols) in shapes.items():
        w, _ = _dense(be, out, cols, rng)
        for rows in (1, 2, 3, 4):
            x = _up(be, _round(be, rng.standard_normal((rows, cols)).astype(np.float32)))
            y = cupy.empty((rows, out), be.kernels.act_dtype)
            simt = cupy.empty_like(y)
            times = {}
            for route in ("old", "tc"):
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                for rep in range(21):
                    if rep == 1:
                        e0.record()
                    if route == "tc":
                        tc_launch(be.kernels, x, w, y, None, TC_WARPS[-1])
                    else:
                        be.projections.gemv_run(("old", 1, 4), x, w, simt)
                e1.record()
                e1.synchronize()
                times[route] = cupy.cuda.get_elapsed_time(e0, e1) / 20 * 1e3
            assert _rel(be.to_host(y), be.to_host(simt)) < 1e-2, (name, rows)
            via = cupy.empty_like(y)  # the same launch as the projections' choice runs it
            be.projections.gemv_run(("tc", TC_WARPS[-1]), x, w, via)
            assert (be.to_host(via) == be.to_host(y)).all(), (name, rows)
            lines.append(
                f"[gemv_tc, 4B bf16 {name} {out}x{cols}, {rows} rows] {times['tc']:.1f} us, "
                f"SIMT (1, 4) {times['old']:.1f} us"
            )
    with capsys.disabled():
        print("\n" + "\n".join(lines))
