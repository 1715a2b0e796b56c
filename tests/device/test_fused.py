"""Fused decode paths against numpy references: add + norm + projection in one gemv4
launch, the DeltaNet gated norm inside out_proj, the conv-state update inside the prep
kernel, and programmatic dependent launch against plain launches."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.backends.cuda.projections import Pro, Prologue
from engine.backends.cuda.tuning import Tuning
from engine.backends.numpy_backend import silu
from tests.device.test_forward import PROMPT, _cuda, _model
from tests.device.test_kernels import TOL, _backend, _quant_weight, _rel, _round, _up

HALF = ["bfloat16", "float16"]
ADD_NORM, GATED_NORM = Prologue.ADD_NORM, Prologue.GATED_NORM


def _norm_ref(be, x, d, w, eps):
    h = x if d is None else _round(be, x + d)
    inv = 1.0 / np.sqrt((h.astype(np.float64) ** 2).mean(1, keepdims=True) + eps)
    return _round(be, (h * inv * w).astype(np.float32)), h


def _gated_ref(be, o, z, nw, dv, eps):
    """What out_proj's GATED_NORM prologue stages: rms_norm per head of dv values of o, times nw,
    times silu(z), rounded to the activation type."""
    rows = o.shape[0]
    oh = o.reshape(rows, -1, dv)
    inv = 1.0 / np.sqrt((oh.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)
    return _round(be, (oh * inv * nw).reshape(rows, -1).astype(np.float32) * silu(z))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("with_delta", [True, False])
def test_norm_linear_fused(dtype, rows, with_delta):
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(rows * 7 + with_delta)
    eps = 1e-6
    for out, cols in [(300, 2560), (33, 1024), (4096, 256), (16, 64)]:
        w, ref_w = _quant_weight(be, out, cols, 4, rng)
        assert be.projections.pro_ok(_up(be, np.zeros((rows, cols), np.float32)), w, ADD_NORM)
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        d = _round(be, rng.standard_normal((rows, cols)).astype(np.float32)) if with_delta else None
        nw = (1 + 0.1 * rng.standard_normal(cols)).astype(np.float32)
        be.frame.scratch.reset()
        dd = None if d is None else _up(be, d)
        (y,), h = be.norm_linear_many(_up(be, x), dd, cupy.asarray(nw), eps, [w])
        u, h_ref = _norm_ref(be, x, d, nw, eps)
        assert np.array_equal(be.to_host(h), h_ref), (out, cols)
        assert _rel(be.to_host(y), u @ ref_w.T) < TOL[dtype], (out, cols)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 5])
def test_norm_mlp_fused(dtype, rows):
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(11 + rows)
    H, inter = 512, 1024
    g, gr = _quant_weight(be, inter, H, 4, rng)
    u, ur = _quant_weight(be, inter, H, 4, rng)
    dn, dr = _quant_weight(be, H, inter, 4, rng)
    x = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
    d = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
    nw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    be.frame.scratch.reset()
    y, h = be.norm_mlp(_up(be, x), _up(be, d), cupy.asarray(nw), 1e-6, g, u, dn)
    un, h_ref = _norm_ref(be, x, d, nw, 1e-6)
    act = _round(be, silu(un @ gr.T) * (un @ ur.T))
    assert np.array_equal(be.to_host(h), h_ref)
    assert _rel(be.to_host(y), act @ dr.T) < TOL[dtype] * 2


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 2, 8])
def test_gated_norm_linear_fused(dtype, rows):
    """out_proj(rms_norm_per_head(o) * w * silu(z)) with z a column slice of a wider row."""
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(rows)
    Hv, dv, H, eps = 32, 128, 2560, 1e-6
    VD = Hv * dv
    w, ref_w = _quant_weight(be, H, VD, 4, rng)
    o = rng.standard_normal((rows, VD)).astype(np.float32)
    wide = _round(be, rng.standard_normal((rows, VD + 256)).astype(np.float32))
    z_host = wide[:, 128 : 128 + VD]
    nw = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    z = _up(be, wide)[:, 128 : 128 + VD]
    assert be.projections.pro_ok(z, w, GATED_NORM, head_dim=dv)
    out = cupy.empty((rows, H), be.kernels.act_dtype)
    pro = Pro(GATED_NORM, cupy.asarray(nw), eps, o=cupy.asarray(o), head_dim=dv)
    be.projections.gemv(z, w, out, pro=pro)
    y = _gated_ref(be, o, z_host, nw, dv, eps)
    assert _rel(be.to_host(out), y @ ref_w.T) < TOL[dtype]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 8])
def test_every_variant_with_each_prologue(dtype, rows):
    """Each gemv4 variant with the residual add and norm, and with the gated per-head norm,
    at 4B shapes; the same bits when run again (fp16's add + norm once summed its warps'
    squares by atomics, which left 14 to 57 of 8 rows' 1,040 outputs differing run to run)."""
    import cupy

    be = _backend(dtype)
    proj = be.projections
    rng = np.random.default_rng(60 + rows)
    eps, H, Hv, dv = 1e-6, 2560, 32, 128
    w, ref_w = _quant_weight(be, 1040, H, 4, rng)
    x = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
    d = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
    nw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    u, h_ref = _norm_ref(be, x, d, nw, eps)
    xd, dd, nwd = _up(be, x), _up(be, d), cupy.asarray(nw)
    tried = 0
    for choice in proj.gemv_candidates(xd, w, pro=Pro(ADD_NORM, nwd, eps, delta=dd)):
        h = cupy.zeros((rows, H), be.kernels.act_dtype)
        out = cupy.empty((rows, 1040), be.kernels.act_dtype)
        proj.gemv_run(choice, xd, w, out, pro=Pro(ADD_NORM, nwd, eps, delta=dd, h=h))
        assert np.array_equal(be.to_host(h), h_ref), choice
        assert _rel(be.to_host(out), u @ ref_w.T) < TOL[dtype], choice
        for _ in range(3):
            again = cupy.empty_like(out)
            proj.gemv_run(choice, xd, w, again, pro=Pro(ADD_NORM, nwd, eps, delta=dd))
            assert np.array_equal(be.to_host(again), be.to_host(out)), choice
        tried += 1
    w, ref_w = _quant_weight(be, H, Hv * dv, 4, rng)
    o = rng.standard_normal((rows, Hv * dv)).astype(np.float32)
    z = _round(be, rng.standard_normal((rows, Hv * dv)).astype(np.float32))
    nw = (1 + 0.1 * rng.standard_normal(dv)).astype(np.float32)
    y = _gated_ref(be, o, z, nw, dv, eps)
    pro = Pro(GATED_NORM, cupy.asarray(nw), eps, o=cupy.asarray(o), head_dim=dv)
    zd = _up(be, z)
    for choice in proj.gemv_candidates(zd, w, pro=pro):
        out = cupy.empty((rows, H), be.kernels.act_dtype)
        proj.gemv_run(choice, zd, w, out, pro=pro)
        assert _rel(be.to_host(out), y @ ref_w.T) < TOL[dtype], choice
        for _ in range(3):
            again = cupy.empty_like(out)
            proj.gemv_run(choice, zd, w, again, pro=pro)
            assert np.array_equal(be.to_host(again), be.to_host(out)), choice
        tried += 1
    assert tried >= 12


def _captured_run(be, model_dir):
    """`_run` of the tiny checkpoint on `be` with its one-row decode graph captured."""
    from engine.backends.cuda.graphs import DecodeGraphs

    model = _model(model_dir, be, slots=1)
    graphs = DecodeGraphs(be, model)
    graphs.capture(1)
    be.reset_slot(0)
    return _run(model, graphs)


def _run(model, graphs=None):
    """Logits of a prompt window, 6 eager steps, then 4 graph replays (if graphs)."""
    be = model.backend
    out = [be.to_host(model.forward(Batch.window(0, 0, len(PROMPT)), np.array(PROMPT)))]
    tok = int(out[0][-1].argmax())
    for i in range(6):
        lg = be.to_host(model.forward(Batch.step([(0, len(PROMPT) + i)]), np.array([tok])))
        out.append(lg)
        tok = int(lg[-1].argmax())
    if graphs is not None:
        for i in range(4):
            batch = Batch.step([(0, len(PROMPT) + 6 + i)])
            logits, toks = graphs.replay(batch, np.array([tok]))
            out.append(be.to_host(logits))
            tok = int(be.to_host(toks)[0])
    return out


@pytest.mark.parametrize("dtype", HALF)
def test_overlapped_launches_match_plain(tiny_dirs, dtype):
    """Programmatic dependent launch changes when kernels start, never what they compute:
    the logits are bit for bit those of plain launches (a missing wait would race)."""
    from engine.backends.cuda.backend import CudaBackend
    from engine.backends.cuda.launch import pdl_available
    from engine.config import EngineSettings

    if not pdl_available():
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    results = []
    for overlap in (True, False):
        be = CudaBackend(EngineSettings(overlap_launches=overlap), dtype=dtype)
        assert be.kernels.pdl is overlap
        results.append(_captured_run(be, tiny_dirs["mlx4"]))
    for a, b in zip(*results, strict=True):
        assert np.array_equal(a, b)


def test_split_deltanet_step_matches_one_block(tiny_dirs):
    """The DeltaNet step over a cluster of blocks a key head (gdn_step_split, the tuned
    count) gives the logits of one block a key head bit for bit, captured in the decode graph
    with overlapped launches, over several steps (the conv taps each block shifts are read
    the next step)."""
    from engine.backends.cuda.backend import CudaBackend
    from engine.config import EngineSettings

    results = []
    for tuning in (Tuning(deltanet_step_blocks=0), Tuning()):
        be = CudaBackend(EngineSettings(), dtype="bfloat16", tuning=tuning)
        results.append(_captured_run(be, tiny_dirs["mlx4"]))
    c = be.config
    dims = (c.linear_num_key_heads, c.linear_num_value_heads, 128, c.linear_value_head_dim)
    if be.deltanet.split_shape(*dims) is None:
        pytest.skip("thread block clusters need compute capability 9.0")
    for a, b in zip(*results, strict=True):
        assert np.array_equal(a, b)


def test_step_conv_state_update_matches_window(tiny_dirs):
    """A step updates the conv state inside gdn_prep; a window uses gdn_conv_state. Both
    leave the same state behind (fp32; the window computes its inputs with a different
    product, so equal to rounding)."""
    models = [_model(tiny_dirs["mlx4"], _cuda("float32"), slots=1) for _ in range(2)]
    ids = np.array(PROMPT[:9])
    models[0].forward(Batch.window(0, 0, 9), ids)
    for i, t in enumerate(ids):
        models[1].forward(Batch.step([(0, i)]), np.array([t]))
    for layer in range(len(models[0].backend.state.conv)):
        a = models[0].backend.to_host(models[0].backend.state.conv[layer][0])
        b = models[1].backend.to_host(models[1].backend.state.conv[layer][0])
        assert np.allclose(a, b, rtol=1e-4, atol=1e-5), layer


@pytest.mark.parametrize("dtype", HALF)
def test_each_weight_order_gets_its_kernel(dtype):
    """4-bit g64 weights in 8-row blocks go to gemv4 (prologues included), the same weights
    in MLX's row order to the SIMT kernel; both give the reference's products, and the
    prompt path (dequantized blocks) and the embedding gather read the blocks too."""
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(11)
    x = _round(be, rng.standard_normal((3, 2560)).astype(np.float32))
    for blocked in (True, False):
        w, ref_w = _quant_weight(be, 1027, 2560, 4, rng, blocked=blocked)
        assert w.blocked is blocked
        kinds = {c[0] for c in be.projections.gemv_candidates(_up(be, x), w)}
        assert kinds == ({"mma"} if blocked else {"old"}), kinds
        for rows in (3, 40):  # 40: dequantized for cuBLAS
            xr = _round(be, rng.standard_normal((rows, 2560)).astype(np.float32))
            be.frame.scratch.reset()
            y = be.to_host(be.linear(_up(be, xr), w))
            assert _rel(y, xr @ ref_w.T) < TOL[dtype], (blocked, rows)
        ids = np.array([0, 1026, 7, 8, 1024, 513], np.int32)
        be.frame.scratch.reset()
        got = be.to_host(be.embedding(w, cupy.asarray(ids)))
        assert _rel(got, ref_w[ids]) < TOL[dtype], blocked


@pytest.mark.parametrize(
    "dtype,bits",
    [("float32", 0), ("float32", 4), ("bfloat16", 0), ("bfloat16", 4), ("float16", 4)],
)
@pytest.mark.parametrize("rows", [1, 3])
def test_every_gemv_variant(dtype, bits, rows):
    """The tuner may pick any candidate, so each one is checked, at real 4B shapes."""
    import cupy

    from engine.backends.cuda.weights import DWeight

    be = _backend(dtype)
    proj = be.projections
    rng = np.random.default_rng(rows + bits)
    for n_out, cols, swiglu in [(9216, 2560, True), (2560, 9216, False), (12352, 2560, False)]:
        if bits:
            w, ref_w = _quant_weight(be, n_out, cols, 4, rng)
            up, ref_u = _quant_weight(be, n_out, cols, 4, rng) if swiglu else (None, None)
        else:
            ref_w = _round(be, rng.standard_normal((n_out, cols)).astype(np.float32) * 0.05)
            w = DWeight(_up(be, ref_w), (n_out, cols))
            ref_u = _round(be, rng.standard_normal((n_out, cols)).astype(np.float32) * 0.05)
            up = DWeight(_up(be, ref_u), (n_out, cols)) if swiglu else None
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        want = x @ ref_w.T
        if swiglu:
            want = silu(want) * (x @ ref_u.T)
        xd = _up(be, x)
        for choice in proj.gemv_candidates(xd, w, up):
            out = cupy.full((rows, n_out), 7, be.kernels.act_dtype)
            proj.gemv_run(choice, xd, w, out, up)
            got = be.to_host(out)
            assert _rel(got, want) < TOL[dtype] * 2, (choice, n_out, cols, swiglu)


def test_tuning_and_capture_leave_the_backends_stream_current(tiny_dirs):
    """The gemv tuner and a graph capture switch streams for a while; afterwards the
    backend's stream must be current again, or the rest of a forward runs on the legacy
    stream and races with the batch copies on the backend's (the cause of a wrong first
    step at the 4B shape)."""
    import cupy

    from engine.backends.cuda.graphs import DecodeGraphs

    be = _cuda("float16")
    rng = np.random.default_rng(5)
    w, _ = _quant_weight(be, 1000 + int(rng.integers(1, 500)) * 8, 512, 4, rng)  # a fresh key
    x = _up(be, np.ones((1, 512), np.float32))
    out = cupy.empty((1, w.shape[0]), be.kernels.act_dtype)
    be.stream.use()
    be.projections.gemv(x, w, out)
    assert cupy.cuda.get_current_stream() == be.stream
    model = _model(tiny_dirs["mlx4"], be, slots=1)
    DecodeGraphs(be, model).capture(1)
    assert cupy.cuda.get_current_stream() == be.stream
