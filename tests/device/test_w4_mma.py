"""The 4-bit tensor-core product (kernels/w4_mma.cu) against numpy, in MLX's row order and
in 8-row blocks, on odd and boundary sizes; and, printed with -s, its time beside the route
prompts take now (the matrix dequantized into the workspace, then cuBLAS) at the 4B's
shapes: kernel figures for choosing the route, not the product's speed."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda.launch import compute_capability
from engine.backends.cuda.w4_mma import w4_applies, w4_mma
from tests.device.test_kernels import _backend, _quant_weight, _rel, _round, _up

TOL = {"bfloat16": 1e-2, "float16": 2e-3}
SHAPES = [(1, 8, 64), (37, 136, 128), (128, 128, 64), (129, 264, 192), (300, 1032, 2560)]


@pytest.fixture(autouse=True)
def _needs_mma():
    if compute_capability() < 80:
        pytest.skip("w4_mma runs on sm_80 and newer")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_w4_mma_matches_numpy(dtype, blocked, shape):
    import cupy

    M, N, K = shape
    be = _backend(dtype)
    rng = np.random.default_rng(M + N + K)
    w, ref_w = _quant_weight(be, N, K, 4, rng, blocked=blocked)
    assert w.blocked == blocked and w4_applies(4, 64, K, N, dtype, compute_capability())
    x = _round(be, rng.standard_normal((M, K)).astype(np.float32))
    out = cupy.full((M, N), 7, be.kernels.act_dtype)  # every element is written
    w4_mma(be.kernels, _up(be, x), w, out)
    got = be.to_host(out)
    want = x @ _round(be, ref_w).T  # the weights as the kernel rounds them
    assert _rel(got, want) < TOL[dtype], shape


def test_w4_mma_equals_the_dequantized_route_and_its_time(capsys):
    """Against `Projections.linear` at prompt sizes (dequantize + cuBLAS): the same values
    to the products' rounding; the two routes' times printed."""
    import cupy

    be = _backend("bfloat16")
    rng = np.random.default_rng(0)
    shapes = {"down": (2560, 9216), "gate/up": (9216, 2560), "in_proj": (12352, 2560)}
    lines = []
    for name, (N, K) in shapes.items():
        w, _ = _quant_weight(be, N, K, 4, rng)
        for M in (512, 2048):
            x = _up(be, _round(be, rng.standard_normal((M, K)).astype(np.float32)))
            out = cupy.empty((M, N), be.kernels.act_dtype)
            be.frame.scratch.reset()
            ref = be.to_host(be.linear(x, w))
            w4_mma(be.kernels, x, w, out)
            assert _rel(be.to_host(out), ref) < 1e-2, (name, M)
            times = {}
            for route in ("w4_mma", "dequant+cuBLAS"):
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                for rep in range(6):
                    if rep == 1:
                        e0.record()
                    be.frame.scratch.reset()
                    if route == "w4_mma":
                        w4_mma(be.kernels, x, w, out)
                    else:
                        be.linear(x, w)
                e1.record()
                e1.synchronize()
                times[route] = cupy.cuda.get_elapsed_time(e0, e1) / 5
            lines.append(
                f"[w4_mma, 4B {name} {N}x{K}, {M} rows] {times['w4_mma']:.3f} ms, "
                f"dequant+cuBLAS {times['dequant+cuBLAS']:.3f} ms"
            )
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_forward_with_every_prompt_product_on_w4_mma(tiny_dirs, dtype, monkeypatch):
    """SNUG_W4_MMA=on: a prompt window's 4-bit products all on w4_mma; its logits as close
    to numpy's as the half-precision bound of tests/device/test_forward.py allows."""
    from engine.backends.numpy_backend import NumpyBackend
    from tests.device.test_forward import BOUND, PROMPT, _cuda, _model, prefill_error

    monkeypatch.setenv("SNUG_W4_MMA", "on")
    cuda = _model(tiny_dirs["mlx4"], _cuda(dtype))
    assert cuda.backend.projections.w4.mode == "on"
    ref = _model(tiny_dirs["mlx4"], NumpyBackend())
    rel = prefill_error(cuda, ref, np.array(PROMPT * 3))  # 60 rows: past the decode kernels' 8
    print(f"\n[w4_mma, tiny mlx4 {dtype}] prefill relative logit error {rel:.3e}")
    assert rel <= BOUND[dtype]


def test_warm_up_times_the_routes(tiny_dirs):
    """auto: warm-up's first window times each 4-bit shape's two routes (fixed and per-row
    costs, all positive or zero)."""
    from engine.config import EngineSettings
    from engine.session import Engine
    from engine.testing.tiny import write_tokenizer

    write_tokenizer(tiny_dirs["mlx4"])  # Engine.load reads one; the other tests need none
    engine = Engine.load(tiny_dirs["mlx4"], EngineSettings(backend="cuda"), context=512)
    fits = engine.backend.projections.w4.fits
    assert fits and all(len(f) == 4 and min(f) >= 0 for f in fits.values())
    engine.unload()
