"""The MLP in one launch (`gemv4_mlp`): gate/up with SwiGLU and the down projection behind
it, whose products are summed in fixed point. Every variant against numpy and against the
separate kernels; the accumulators' bookkeeping; the forward with it against without."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_backend import silu
from tests.device.test_forward import _model
from tests.device.test_fused import HALF, _norm_ref, _run
from tests.device.test_kernels import TOL, _backend, _quant_weight, _rel, _round, _up

SCALE = 2.0**-32  # the accumulator's fixed point


def _unfix(be, acc):
    """What a consumer reads from an accumulator: the sums rounded to the activation type."""
    return _round(be, (acc.get().astype(np.float64) * SCALE).astype(np.float32))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 2])
def test_every_fused_mlp_variant(dtype, rows):
    """Each variant the tuner may pick, on 4B's hidden size and on small and odd ones (a
    hidden size whose down tiles do not fill every warp; 17 column groups): the sums equal
    numpy's MLP to the activation type's rounding, equal the separate kernels' output as
    closely, and launched again add the same; the other buffer is cleared."""
    import cupy

    from engine.backends.cuda.gemv import GEMV4_MLP_VARIANTS, Pro

    be = _backend(dtype)
    be.ops.fused_mlp = True
    rng = np.random.default_rng(5 + rows)
    eps = 1e-6
    for H, inter in [(2560, 640), (64, 128), (1088, 256)]:
        g, gr = _quant_weight(be, inter, H, 4, rng)
        u, ur = _quant_weight(be, inter, H, 4, rng)
        dn, dr = _quant_weight(be, H, inter, 4, rng)
        x = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
        d = _round(be, rng.standard_normal((rows, H)).astype(np.float32))
        nw = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        xd, dd = _up(be, x), _up(be, d)
        assert be.ops.mlp_fits(xd, g, u, dn)
        un, h_ref = _norm_ref(be, x, d, nw, eps)
        want = _round(be, silu(un @ gr.T) * (un @ ur.T)) @ dr.T
        # the separate kernels: gate/up with the same prologue, then down
        act = cupy.empty((rows, inter), be.ops.act_dtype)
        sep = cupy.empty((rows, H), be.ops.act_dtype)
        pro = Pro(1, cupy.asarray(nw), eps, delta=dd, h=cupy.empty((rows, H), be.ops.act_dtype))
        be.ops.gemv(xd, g, act, up=u, pro=pro)
        be.ops.gemv(act, dn, sep)
        sep = be.to_host(sep)
        for v in GEMV4_MLP_VARIANTS:
            sums = []
            for _ in range(2):
                acc = cupy.zeros((rows, H), cupy.int64)
                zero = cupy.full((8, H), 7, cupy.int64)
                h = cupy.zeros((rows, H), be.ops.act_dtype)
                pro = Pro(1, cupy.asarray(nw), eps, delta=dd, h=h)
                be.ops._mlp_launch(("mlp", *v), xd, g, u, dn, acc, zero, pro)
                assert not zero.any(), v
                assert np.array_equal(be.to_host(h), h_ref), v
                sums.append(acc.get())
            # the sums are integers (any order); the prologue's norm sums floats
            assert _rel(sums[1] * SCALE, sums[0] * SCALE) < 1e-3, (v, H)
            y = _unfix(be, cupy.asarray(sums[0]))
            assert _rel(y, want) < TOL[dtype] * 2, (v, H, _rel(y, want))
            assert _rel(y, sep) < TOL[dtype], (v, H, _rel(y, sep))


def _sums(be):
    return [be.mlp_acc[i].get() for i in range(be.mlp_acc.shape[0])]


@pytest.mark.parametrize("dtype", HALF)
def test_forward_with_the_mlp_in_one_launch(tiny_dirs, dtype):
    """The forward with the fused MLP (prompt window, eager steps, graph replays) gives the
    logits of the one without, to rounding; between forwards every accumulator but the last
    layer's is zero; a forward stopped between layers leaves nothing behind."""
    from engine.backends.base import Batch
    from engine.backends.cuda.backend import CudaBackend
    from engine.backends.cuda.graphs import DecodeGraphs
    from tests.device.test_forward import PROMPT

    results = []
    for fused in (False, True):
        be = CudaBackend(dtype=dtype)
        be.ops.fused_mlp, be.ops.mlp_min_blocks = fused, 1
        model = _model(tiny_dirs["mlx4"], be, slots=1)
        graphs = DecodeGraphs(be, model)
        graphs.capture(1)
        be.reset_slot(0)
        results.append(_run(model, graphs))
        acc = _sums(be)
        if fused:
            n = model.config.num_hidden_layers
            last = 2 if n % 2 else (n - 1) % 2
            assert acc[last].any()
            assert all(not a.any() for i, a in enumerate(acc) if i != last)
    for a, b in zip(*results, strict=True):
        assert a.shape == b.shape
        assert _rel(b, a) < 2e-2, _rel(b, a)

    # a forward that stops between layers: the next one starts from clean sums
    be.reset_slot(0)
    ref = be.to_host(model.forward(Batch.step([(0, 0)]), np.array([PROMPT[0]])))
    be.reset_slot(0)
    orig = be.begin_layer

    def stop_at_two(i):
        if i == 2:
            raise RuntimeError("stopped")
        orig(i)

    be.begin_layer = stop_at_two
    with pytest.raises(RuntimeError):
        model.forward(Batch.step([(0, 0)]), np.array([PROMPT[0]]))
    be.begin_layer = orig
    be.reset_slot(0)
    again = be.to_host(model.forward(Batch.step([(0, 0)]), np.array([PROMPT[0]])))
    assert np.array_equal(ref, again)


def test_graph_replays_equal_eager_steps_with_the_fused_mlp(tiny_dirs):
    """Replaying the captured step (accumulators cleared inside the graph) gives the eager
    step's logits bit for bit, step after step."""
    from engine.backends.base import Batch
    from engine.backends.cuda.backend import CudaBackend
    from engine.backends.cuda.graphs import DecodeGraphs
    from tests.device.test_forward import PROMPT

    outs = []
    for use_graph in (False, True):
        be = CudaBackend(dtype="bfloat16")
        be.ops.fused_mlp, be.ops.mlp_min_blocks = True, 1
        model = _model(tiny_dirs["mlx4"], be, slots=1)
        graphs = DecodeGraphs(be, model) if use_graph else None
        if graphs is not None:
            graphs.capture(1)
        be.reset_slot(0)
        model.forward(Batch.window(0, 0, len(PROMPT)), np.array(PROMPT))
        tok, got = 1, []
        for i in range(5):
            batch = Batch.step([(0, len(PROMPT) + i)])
            if graphs is None:
                lg = model.forward(batch, np.array([tok]))
            else:
                lg, _ = graphs.replay(batch, np.array([tok]))
            got.append(be.to_host(lg))
            tok = int(got[-1][-1].argmax())
        outs.append(got)
    for a, b in zip(*outs, strict=True):
        assert np.array_equal(a, b)
