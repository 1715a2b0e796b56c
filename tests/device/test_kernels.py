"""Every kernel against its numpy reference, on odd and boundary sizes."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.backends.cuda.tuning import Tuning
from engine.backends.numpy_backend import NumpyBackend, silu
from engine.checkpoint.quantized import QuantizedTensor
from engine.model_config import parse_config
from engine.sampling import Draw

SIZES = [1, 2, 17, 31, 33, 256, 2048]
TOL = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 4e-3}


def _backend(dtype="float32", **kw):
    from engine.backends.cuda.backend import CudaBackend

    return CudaBackend(dtype=dtype, **kw)


def _up(be, x):
    """Host float32 -> device array of the backend's activation type."""
    import cupy

    from engine.bf16 import to_bf16

    if be.dtype == "bfloat16":
        return cupy.asarray(to_bf16(x))
    return cupy.asarray(x.astype(be.kernels.act_dtype))


def _quant_weight(be, out, cols, bits, rng, blocked=None):
    """A random quantized matrix on the device and its dequantized float32 reference; in
    8-row blocks where the checkpoint loader would put it in them (blocked=None), or as
    asked."""
    import cupy

    from engine.backends.cuda.weights import QWeight, blocked_copy
    from engine.bf16 import from_bf16
    from engine.testing.synth import quantize_affine

    w = rng.standard_normal((out, cols)).astype(np.float32) * 0.1
    p, s, b = quantize_affine(w, bits, 64)
    ref = QuantizedTensor(p, from_bf16(s), from_bf16(b), bits, 64, (out, cols))
    scales = cupy.empty(s.shape, be.kernels.act_dtype)
    biases = cupy.empty(s.shape, be.kernels.act_dtype)
    be.norms.convert("from_bf16", cupy.asarray(s).reshape(-1), scales.reshape(-1))
    be.norms.convert("from_bf16", cupy.asarray(b).reshape(-1), biases.reshape(-1))
    q = QWeight(cupy.asarray(p), scales, biases, bits, 64, (out, cols))
    if blocked is None:
        blocked = be.projections.blocks_ok(bits, 64, cols)
    return (blocked_copy(be.projections, q) if blocked else q), ref.dequantize()


def _rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def _round(be, x):
    """What the activation type can hold of x (so references start from the same inputs)."""
    from engine.bf16 import from_bf16, to_bf16

    if be.dtype == "bfloat16":
        return from_bf16(to_bf16(x))
    return x.astype(be.kernels.act_dtype).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bits", [4, 8, 0])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, 33])
def test_linear(dtype, bits, rows):
    import cupy

    from engine.backends.cuda.weights import DWeight

    be = _backend(dtype)
    rng = np.random.default_rng(rows + bits)
    for out, cols in [(1, 256), (17, 512), (31, 128), (33, 2048), (2048, 256), (256, 64)]:
        if bits:
            w, ref_w = _quant_weight(be, out, cols, bits, rng)
        else:
            ref_w = _round(be, rng.standard_normal((out, cols)).astype(np.float32) * 0.1)
            w = DWeight(_up(be, ref_w), (out, cols))
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        be.frame.scratch.reset()
        y = be.to_host(be.linear(_up(be, x), w))
        assert _rel(y, x @ ref_w.T) < TOL[dtype], (out, cols)
    cupy.cuda.get_current_stream().synchronize()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 2, 17])
def test_mlp_swiglu(dtype, rows):
    be = _backend(dtype)
    rng = np.random.default_rng(7)
    H, inter = 256, 512
    g, gr = _quant_weight(be, inter, H, 4, rng)
    u, ur = _quant_weight(be, inter, H, 4, rng)
    d, dr = _quant_weight(be, H, inter, 4, rng)
    x = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
    be.frame.scratch.reset()
    y = be.to_host(be.mlp(_up(be, x), g, u, d))
    ref = (silu(x @ gr.T) * (x @ ur.T)) @ dr.T
    assert _rel(y, ref) < TOL[dtype] * 2


@pytest.mark.parametrize("rows", [1, 5])
def test_linear_q4_half(rows):
    """fp16 activations take the tensor-core 4-bit kernel too (fused SwiGLU included)."""
    be = _backend("float16")
    rng = np.random.default_rng(rows)
    for out, cols in [(33, 2560), (8, 64), (300, 1024)]:
        w, ref_w = _quant_weight(be, out, cols, 4, rng)
        u, ref_u = _quant_weight(be, out, cols, 4, rng)
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        be.frame.scratch.reset()
        y = be.to_host(be.linear(_up(be, x), w))
        assert _rel(y, x @ ref_w.T) < TOL["float16"], (out, cols)
        h = be.frame.take((rows, out))
        be.projections.gemv(_up(be, x), w, h, up=u)
        ref = silu(x @ ref_w.T) * (x @ ref_u.T)
        assert _rel(be.to_host(h), ref) < TOL["float16"] * 2, (out, cols)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n", SIZES)
def test_norms(dtype, n):
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(n)
    x = _round(be, rng.standard_normal((5, n)).astype(np.float32))
    d = _round(be, rng.standard_normal((5, n)).astype(np.float32))
    w = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    ref = NumpyBackend()
    be.frame.scratch.reset()
    y = be.to_host(be.rms_norm(_up(be, x), cupy.asarray(w), 1e-6))
    assert _rel(y, ref.rms_norm(x, w, 1e-6)) < TOL[dtype]
    yn, h = be.add_rms_norm(_up(be, x), _up(be, d), cupy.asarray(w), 1e-6)
    ry, rh = ref.add_rms_norm(x, d, w, 1e-6)
    assert _rel(be.to_host(h), rh) < TOL[dtype]
    assert _rel(be.to_host(yn), ry) < TOL[dtype] * 2


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embedding(bits, dtype):
    import cupy

    be = _backend(dtype)
    rng = np.random.default_rng(1)
    w, ref_w = _quant_weight(be, 300, 256, bits, rng)
    ids = np.array([0, 299, 17, 31, 33, 256, 2], np.int32)
    be.frame.scratch.reset()
    y = be.to_host(be.embedding(w, cupy.asarray(ids)))
    assert _rel(y, ref_w[ids]) < TOL[dtype]


def _config(hq=4, hkv=2, hk=2, hv=4):
    from engine.testing.synth import SHAPES, text_config

    shape = dict(
        SHAPES["tiny"],
        num_attention_heads=hq,
        num_key_value_heads=hkv,
        linear_num_key_heads=hk,
        linear_num_value_heads=hv,
    )
    return parse_config(text_config(shape))


def _pair(dtype, slots=3, context=600, c=None):
    c = c or _config()
    be, ref = _backend(dtype), NumpyBackend()
    be.alloc_state(c, slots, context)
    ref.alloc_state(c, slots, context)
    be.vocab_rows = c.vocab_size
    return c, be, ref


def _runs():
    """(description, list of batches) covering windows of odd sizes then steps."""
    return [
        [Batch.window(0, 0, 17), Batch.step([(0, 17), (1, 0)]), Batch.window(1, 1, 33)],
        [Batch.window(2, 0, 1), Batch.window(2, 1, 2), Batch.window(2, 3, 256)],
        [
            Batch((Batch.window(0, 0, 31).segments[0], Batch.window(1, 0, 64).segments[0])),
            Batch.window(0, 31, 300),
        ],
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("run", range(3))
def test_attention(dtype, run):
    import cupy

    c, be, ref = _pair(dtype)
    rng = np.random.default_rng(run)
    Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    qn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    kn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    for batch in _runs()[run]:
        R = batch.rows
        qg = _round(be, rng.standard_normal((R, Hq * 2 * hd)).astype(np.float32))
        k = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32))
        v = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32))
        be.prepare(batch, np.zeros(R, np.int32))
        y = be.to_host(
            be.attention(
                0, _up(be, qg), _up(be, k), _up(be, v), cupy.asarray(qn), cupy.asarray(kn), batch
            )
        )
        r = ref.attention(0, qg, k, v, qn, kn, batch)
        assert _rel(y, r) < TOL[dtype] * 3, [s for s in batch.segments]


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("splits", [128, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (16, 4), (16, 2)])
def test_decode_attention_lengths(dtype, hq, hkv, splits, warps, monkeypatch):
    """Decode steps of three streams at lengths that end inside a split, on a split boundary
    and inside a warp's group of keys, for 2, 4 and 8 query heads per KV head; with at most
    4 splits a KV head too, so the splits grow with the length (75 keys at 300). The kernel
    runs in 8 warps only where its grid fits one block an SM: the SM count is set so that
    each block size runs."""
    import cupy

    monkeypatch.setattr("engine.memory.scratch.ATTN_SPLITS", splits)
    monkeypatch.setattr(
        "engine.backends.cuda.attention.sm_count", lambda: 0 if warps == 4 else 1 << 20
    )
    c, be, ref = _pair(dtype, c=_config(hq=hq, hkv=hkv))
    rng = np.random.default_rng(hq + hkv)
    hd = c.head_dim
    qn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    kn = (1 + 0.1 * rng.standard_normal(hd)).astype(np.float32)
    lengths = (300, 63, 5)  # 64 keys (two splits of 32) after the first step of slot 1
    batches = [Batch.window(s, 0, n) for s, n in enumerate(lengths)]
    batches += [Batch.step([(s, n + t) for s, n in enumerate(lengths)]) for t in range(3)]
    for batch in batches:
        R = batch.rows
        qg = _round(be, rng.standard_normal((R, hq * 2 * hd)).astype(np.float32))
        k = _round(be, rng.standard_normal((R, hkv * hd)).astype(np.float32))
        v = _round(be, rng.standard_normal((R, hkv * hd)).astype(np.float32))
        be.prepare(batch, np.zeros(R, np.int32))
        dev = [_up(be, a) for a in (qg, k, v)]
        y = be.to_host(be.attention(0, *dev, cupy.asarray(qn), cupy.asarray(kn), batch))
        r = ref.attention(0, qg, k, v, qn, kn, batch)
        assert _rel(y, r) < TOL[dtype] * 3, [s for s in batch.segments]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("run", range(3))
def test_gated_delta(dtype, run):
    import cupy

    c, be, ref = _pair(dtype)
    rng = np.random.default_rng(10 + run)
    C, VD, Hv = c.conv_dim, c.value_dim, c.linear_num_value_heads
    params = {
        "conv1d": rng.standard_normal((C, 4)).astype(np.float32) * 0.3,
        "A_log": np.log(rng.uniform(1, 16, Hv)).astype(np.float32),
        "dt_bias": rng.standard_normal(Hv).astype(np.float32) * 0.5,
        "norm": (1 + 0.1 * rng.standard_normal(128)).astype(np.float32),
    }
    dev = {k: cupy.asarray(v) for k, v in params.items()}
    for batch in _runs()[run]:
        R = batch.rows
        mixed = _round(be, rng.standard_normal((R, C)).astype(np.float32))
        z = _round(be, rng.standard_normal((R, VD)).astype(np.float32))
        b = _round(be, rng.standard_normal((R, Hv)).astype(np.float32))
        a = _round(be, rng.standard_normal((R, Hv)).astype(np.float32))
        be.prepare(batch, np.zeros(R, np.int32))
        y = be.gated_delta(1, _up(be, mixed), _up(be, z), _up(be, b), _up(be, a), dev, batch)
        r = ref.gated_delta(1, mixed, z, b, a, params, batch)
        assert _rel(be.to_host(y), r) < TOL[dtype] * 3, [s for s in batch.segments]
    state = cupy.asnumpy(be.state.recurrent[1, :3]).transpose(0, 1, 3, 2)  # [slots, Hv, dk, dv]
    assert _rel(state, ref.recurrent[1]) < (1e-4 if dtype == "float32" else 5e-2)


@pytest.mark.parametrize("chunk", [64, 32, 16])
def test_chunked_delta_rule_matches_the_scan(chunk):
    """gdn_chunk (windows) against the token-by-token scan on the same inputs and state, for
    each chunk size a GPU may get: segments shorter than a chunk, ending on a chunk boundary
    and a chunk plus one row, three streams in one launch, two value heads per key head."""
    import cupy

    from engine.backends.cuda.deltanet import chunk_smem
    from engine.backends.cuda.launch import smem_per_block

    be = _backend("float32")
    optin = smem_per_block()
    if chunk_smem(chunk) > optin:
        pytest.skip(f"this GPU gives a block {optin} bytes of shared memory")
    rng = np.random.default_rng(chunk)
    Hk, Hv, dv, dk = 2, 4, 128, 128
    rows = [5, 2 * chunk, chunk + 1]
    R = sum(rows)
    q = rng.standard_normal((R, Hk, dk)).astype(np.float32)
    k = rng.standard_normal((R, Hk, dk)).astype(np.float32)
    q /= np.linalg.norm(q, axis=2, keepdims=True) * np.sqrt(dk)
    k /= np.linalg.norm(k, axis=2, keepdims=True)
    v = rng.standard_normal((R, Hv * dv)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, (R, Hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (R, Hv)).astype(np.float32)
    state0 = (0.1 * rng.standard_normal((3, Hv, dv, dk))).astype(np.float32)
    row0 = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int32)
    segs = [cupy.asarray(a, dtype=cupy.int32) for a in ([2, 0, 1], row0, rows)]
    dev = [cupy.asarray(a.reshape(R, -1)) for a in (q, k, v, g, beta)]
    results = []
    for chunked in (True, False):
        state, o = cupy.asarray(state0), cupy.zeros((R, Hv * dv), cupy.float32)
        be.deltanet._chunk_rows = chunk  # the chunk size under test, whatever the GPU's
        if chunked:
            assert be.deltanet.chunk(*dev, state, segs, 3, o, Hk, Hv, dv)
        else:
            be.deltanet.scan(*dev, state, segs, 3, o, Hk, Hv, dv)
        results.append((cupy.asnumpy(o), cupy.asnumpy(state)))
    (o_chunk, s_chunk), (o_scan, s_scan) = results
    assert _rel(o_chunk, o_scan) < 1e-4
    assert _rel(s_chunk, s_scan) < 1e-4
    # and against the numpy reference (engine/backends/gdn.py), segment by segment
    from engine.backends.gdn import chunked as reference

    rep = Hv // Hk
    for seg, slot in enumerate([2, 0, 1]):
        r = slice(row0[seg], row0[seg] + rows[seg])
        st = state0[slot].transpose(0, 2, 1).copy()  # [Hv, dk, dv]
        want = reference(
            np.repeat(q[r], rep, axis=1),
            np.repeat(k[r], rep, axis=1),
            v[r].reshape(-1, Hv, dv),
            g[r],
            beta[r],
            st,
        )
        assert _rel(o_chunk[r].reshape(-1, Hv, dv), want) < 1e-4, seg
        assert _rel(s_chunk[slot].transpose(0, 2, 1), st) < 1e-4, seg


def _unaligned(dl):
    """A copy of device logits whose rows do not start on 16 bytes: the draw reads it one
    logit a thread at a time (the narrow kernel), where an aligned row is read 32 at a time."""
    import cupy

    rows, V = dl.shape
    # Contiguous rows (the kernels take the row length as the stride), one element late.
    out = cupy.zeros(rows * V + 8, dl.dtype)[1 : rows * V + 1].reshape(rows, V)
    out[...] = dl
    assert out.data.ptr % 16
    return out


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("V", [1, 2, 17, 33, 2048, 248320])
def test_sampling(V, wide):
    import cupy

    be = _backend("float32")
    sm = be.sampling
    rng = np.random.default_rng(V)
    logits = rng.standard_normal((3, V)).astype(np.float32) * 3
    be.vocab_rows = V
    sm.counter = cupy.zeros(8, cupy.uint32)
    dl = cupy.asarray(logits)
    draws = dl if wide else _unaligned(dl)  # what the draws read
    be.frame.scratch.reset()
    got = cupy.asnumpy(be.sample_greedy(dl))
    assert (got == logits.argmax(1)).all()
    # Split over blocks (what a decode step runs); twice, since it must leave its work zeroed.
    # Ties go to the lowest index, as numpy's argmax does.
    sm.argmax_work = cupy.zeros(2 * 3, cupy.uint64)
    tied = np.round(logits)
    for case in (logits, logits, tied, tied):
        got = cupy.asnumpy(be.sample_greedy(cupy.asarray(case)))
        assert (got == case.argmax(1)).all()
    assert not sm.argmax_work.any()
    sm.argmax_work = None
    # More than 1024 logits tied in the bins the fast path would keep: the radix select
    # narrows them down (three clear winners at a low temperature).
    flat = np.zeros((1, 4096), np.float32)
    flat[0, [7, 100, 2000]] = 1.0
    be.vocab_rows = flat.shape[1]
    dflat = cupy.asarray(flat) if wide else _unaligned(cupy.asarray(flat))
    for seed in range(4):
        pick = int(cupy.asnumpy(be.sample(dflat, 0.01, 5, 1.0, seed=seed))[0])
        assert pick in (7, 100, 2000)
    be.vocab_rows = V
    # A decode step's picks: greedy rows keep the step's argmax, the others draw (top-k 1 is
    # the argmax, top-k 5 one of the five largest).
    sm.picks = cupy.zeros(8, cupy.int32)
    greedy = cupy.asarray(np.array([5, 6, 7], np.int32))
    for seed in range(5):
        rows = [None, Draw(1.0, 1, 1.0, seed), Draw(2.0, 5, 1.0, seed)]
        picks = cupy.asnumpy(be.sample_rows(draws, greedy, rows))
        assert picks[0] == 5 and picks[1] == logits[1].argmax()
        assert picks[2] in np.argsort(-logits[2], kind="stable")[: min(5, V)]
    # Presence penalty: a top-1 draw of the penalised logits walks down the ranking, each
    # pick marked in the slot's bitmap so the next draw skips it.
    if V >= 4:
        sm.seen = cupy.zeros((2, -(-V // 32)), cupy.uint32)
        order = np.argsort(-logits[1], kind="stable")
        gap = float(logits[1, order[0]] - logits[1, order[3]]) + 1.0
        want, got = [int(order[0])], []
        for step in range(3):
            draw = Draw(1.0, 1, 1.0, step, gap, 1, (want[0],) if step == 0 else (), step == 0)
            got.append(int(cupy.asnumpy(be.sample_rows(draws[1:2], greedy, [draw]))[0]))
        assert got == [int(order[1]), int(order[2]), int(order[3])]
        marked = np.unpackbits(cupy.asnumpy(sm.seen[1]).view(np.uint8), bitorder="little")
        assert set(np.flatnonzero(marked)) == set(order[:4].tolist())
        assert not sm.seen[0].any()
    for k, p in [(1, 1.0), (5, 1.0), (50, 0.9), (0, 0.5)]:
        seen = set()
        for _ in range(20):
            ids = cupy.asnumpy(be.sample(draws, 1.0, k, p, seed=11))
            for row, i in enumerate(ids):
                order = np.argsort(-logits[row], kind="stable")
                kk = min(1024 if k == 0 else k, V)
                assert 0 <= i < V and i in order[:kk], (k, p, i)
                seen.add(int(i))
        if k == 1:
            assert seen <= set(logits.argmax(1).tolist())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("V", [40, 1001, 4096, 248320])
def test_wide_sampler_draws_what_the_narrow_one_draws(dtype, V):
    """The draw reading 32 logits a thread at a time keeps the same candidates as the one
    reading one, so the same seeds give the same picks: with and without a presence penalty
    (each draw marking its pick), at temperatures that spread the draw, and where the top
    bins hold more than 1024 logits (the radix select). The narrow draw reads a copy whose
    rows do not start on 16 bytes; at 1001 no row of either does. The third row draws with
    the app's defaults (top-k 20): at 248320 the wide draw is the split one."""
    import cupy

    from engine.backends.cuda.sampling import draw_buffers

    be = _backend(dtype)
    sm = be.sampling
    rng = np.random.default_rng(V)
    logits = rng.standard_normal((3, V)).astype(np.float32) * 2
    if V == 4096:
        logits[1] = np.round(logits[1] * 0.1)  # thousands of ties: the radix select
    dl = _up(be, _round(be, logits))
    be.vocab_rows = V
    sm.picks = cupy.zeros(8, cupy.int32)
    sm.draw_cand = draw_buffers()  # the app's defaults take the split draw at 248320 (wide)
    greedy = cupy.zeros(3, cupy.int32)
    runs = []
    for rows_in in (_unaligned(dl), dl):  # narrow, then wide
        sm.seen = cupy.zeros((3, -(-V // 32)), cupy.uint32)
        picks = []
        for step in range(12):
            rows = [
                Draw(1.5, 50, 0.95, step),
                Draw(0.8, 1024, 0.9, step, 0.7, 1, (3,) if step == 0 else (), step == 0),
                Draw(0.7, 20, 0.8, step, 1.5, 2, (), step == 0),  # the app's defaults
            ]
            picks.append(cupy.asnumpy(be.sample_rows(rows_in, greedy, rows)).tolist())
        runs.append((picks, cupy.asnumpy(sm.seen)))
    assert runs[0][0] == runs[1][0]
    assert np.array_equal(runs[0][1], runs[1][1])
    assert all(0 <= i < V for p in runs[0][0] for i in p)
    assert len({p[0] for p in runs[0][0]}) > 1  # the draws spread


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("top_k", [3, 20, 50])
def test_draw_cuts_the_nucleus_in_order(top_k, wide):
    """Three clear leaders planted out of index order in a 248K row of noise: at top-p just
    above the first two's share of the top-k mass, every draw is one of those two, and both
    come up (the candidates sorted by value, not by index or arrival). Wide with top-k <= 32
    this is the split draw (draw_candidates first); a flat row overflows its blocks' slots,
    and the draw falls back to reading the row. Narrow: rows not on 16 bytes."""
    import cupy

    from engine.backends.cuda.sampling import draw_buffers

    be = _backend("bfloat16")
    sm = be.sampling
    V = 248320
    rng = np.random.default_rng(top_k)
    logits = rng.standard_normal((1, V)).astype(np.float32)
    lead = [200001, 17, 99000]  # largest first
    logits[0, lead] = [12.0, 11.75, 11.25]
    logits = _round(be, logits)
    top = np.sort(logits[0])[::-1][:top_k]
    prob = np.exp(top - top[0])
    cum = np.cumsum(prob / prob.sum())
    top_p = float(cum[1]) - 0.02  # the nucleus is the first two
    assert cum[0] < top_p - 0.05
    be.vocab_rows = V
    sm.counter = cupy.zeros(8, cupy.uint32)
    sm.draw_cand = draw_buffers()
    dl = _up(be, logits) if wide else _unaligned(_up(be, logits))
    picks = {int(cupy.asnumpy(be.sample(dl, 1.0, top_k, top_p, seed=s))[0]) for s in range(40)}
    assert picks == set(lead[:2]), picks
    counts = cupy.asnumpy(sm.draw_cand[2])
    if wide and top_k <= 32:  # the split draw ran: every block kept a few, all fitted
        assert (counts >= top_k).all() and (counts <= 64).all(), counts
    else:
        assert not counts.any()
    # A flat row (every block's candidates overflow: the draw reads the row itself).
    flat = np.zeros((1, V), np.float32)
    flat[0, lead] = 1.0
    dl = _up(be, flat) if wide else _unaligned(_up(be, flat))
    for s in range(4):
        assert int(cupy.asnumpy(be.sample(dl, 0.01, top_k, 1.0, seed=s))[0]) in lead
    if wide and top_k <= 32:
        assert (cupy.asnumpy(sm.draw_cand[2]) > 64).all()


@pytest.mark.parametrize("split", [0, Tuning().deltanet_step_blocks])
@pytest.mark.parametrize("Hk,Hv", [(2, 4), (2, 2), (16, 32)])
def test_fused_deltanet_step_matches_prep_and_scan(Hk, Hv, split):
    """gdn_step (conv, gates, norms and the delta rule of a decode step in one launch), and
    gdn_step_split over the tuned blocks a key head, against gdn_prep + gdn_scan on the same
    inputs: three streams in slots out of order, one and two value heads per key head, and
    the 4B's head counts. The states agree exactly and the outputs to rounding (measured on
    an H200 for gdn_step: states equal, outputs within 7.5e-9). The fused launch also brings
    three quantized weights toward L2 (`ahead`, as the decode step does), which must change
    nothing."""
    import cupy

    from engine.backends.cuda.weights import QWeight

    be = _backend("bfloat16", tuning=Tuning(deltanet_step_blocks=split))
    dn = be.deltanet
    if split and dn.split_shape(Hk, Hv, 128, 128) is None:
        pytest.skip("thread block clusters need compute capability 9.0")
    rng = np.random.default_rng(Hk * 10 + Hv)
    dk = dv = 128
    K, S, slots = 4, 3, 4
    KD, VD = Hk * dk, Hv * dv
    C = 2 * KD + VD
    dims = (Hk, Hv, dk, dv, K)
    assert dn.step_shape(Hk, Hv, dk, dv)

    def act(*shape):
        return _round(be, rng.standard_normal(shape).astype(np.float32))

    mixed, a, b, cs0 = (
        _up(be, act(S, C)),
        _up(be, act(S, Hv)),
        _up(be, act(S, Hv)),
        act(slots, K - 1, C),
    )
    conv_w = cupy.asarray((0.3 * rng.standard_normal((C, K))).astype(np.float32))
    A_log = cupy.asarray(rng.uniform(-1, 1, Hv).astype(np.float32))
    dt_bias = cupy.asarray(rng.uniform(-1, 1, Hv).astype(np.float32))
    st0 = (0.1 * rng.standard_normal((slots, Hv, dv, dk))).astype(np.float32)
    seg = [cupy.asarray(x, dtype=cupy.int32) for x in ([2, 0, 3], np.arange(S), np.ones(S))]
    results = []
    for fused in (True, False):
        cs, st = _up(be, cs0), cupy.asarray(st0)
        o = cupy.zeros((S, VD), cupy.float32)
        if fused:
            # [n, 576] 4-bit weights, codes (288 bytes a row), scales and biases (18 bytes)
            # carved one after another from one buffer, as the arena does
            buf, act = cupy.ones(2320 * 324, cupy.uint8), be.kernels.act_dtype
            ahead, at = (), 0
            for n in (304, 1008, 1008):
                parts = []
                for width, dt in ((288, cupy.uint32), (18, act), (18, act)):
                    parts.append(buf[at : at + n * width].view(dt).reshape(n, -1))
                    at += n * width
                ahead += (QWeight(*parts, 4, 64, (n, 576)),)
            dn.step(mixed, conv_w, cs, a, b, A_log, dt_bias, st, seg, S, o, dims, ahead)
        else:
            f = cupy.float32
            outs = tuple(cupy.zeros((S, n), f) for n in (KD, KD, VD, Hv, Hv))
            row_tl = cupy.zeros(S, cupy.int32)
            dn.prep(mixed, conv_w, cs, a, b, A_log, dt_bias, seg[0], row_tl, outs, dims, True)
            dn.scan(*outs, st, seg, S, o, Hk, Hv, dv)
        results.append([be.to_host(x) for x in (o, st, cs)])
    for name, x, y in zip(("o", "state", "conv state"), *results, strict=True):
        diff = float(np.abs(x - y).max())
        print(f"\n[gdn_step {Hk}x{Hv} split {split}] {name}: largest difference {diff:.2e}")
        assert diff <= 1e-6 * max(1.0, float(np.abs(y).max())), name
