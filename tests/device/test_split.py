"""Projections split over column slices (`gemv4_split`), summed in fixed point: every
variant against numpy and the whole projection; the decode step with split down projections
against the step without; the accumulators' bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest

from tests.device.test_forward import PROMPT, _model
from tests.device.test_fused import HALF, _run
from tests.device.test_kernels import TOL, _backend, _quant_weight, _rel, _round, _up

SCALE = 2.0**-32  # the accumulator's fixed point


def _unfix(be, acc):
    """What a consumer reads from an accumulator: the sums rounded to the activation type."""
    return _round(be, (acc.get().astype(np.float64) * SCALE).astype(np.float32))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_every_split_variant(dtype, rows):
    """Each candidate the tuner may pick, on 4B's down shape, a row count that is not a
    multiple of 16 and a short one: the sums equal numpy's product to the activation type's
    rounding and the whole projection's output as closely, are the same bit for bit when
    launched again (integer sums), and the other buffer is cleared."""
    import cupy

    be = _backend(dtype)
    be.ops.split_down = True
    rng = np.random.default_rng(9 + rows)
    for out, cols in [(2560, 9216), (1000, 512), (48, 1024)]:
        w, ref_w = _quant_weight(be, out, cols, 4, rng)
        x = _round(be, rng.standard_normal((rows, cols)).astype(np.float32))
        xd = _up(be, x)
        assert be.ops.split_ok(xd, w)
        whole = cupy.empty((rows, out), be.ops.act_dtype)
        be.ops.gemv(xd, w, whole)
        whole = be.to_host(whole)
        want = x @ ref_w.T
        cands = be.ops.split_candidates(xd, w)
        assert {c[1] for c in cands} == {2, 4, 8}
        for c in cands:
            sums = []
            for _ in range(2):
                acc = cupy.zeros((rows, out), cupy.int64)
                zero = cupy.full((8, out), 7, cupy.int64)
                be.ops._split_launch(c, xd, w, acc, zero)
                assert not zero.any(), c
                sums.append(acc.get())
            assert np.array_equal(sums[0], sums[1]), (c, out)
            y = _unfix(be, cupy.asarray(sums[0]))
            assert _rel(y, want) < TOL[dtype], (c, out, _rel(y, want))
            assert _rel(y, whole) < TOL[dtype], (c, out, _rel(y, whole))


def _split_model(tiny_dirs, dtype, split):
    from engine.backends.cuda.backend import CudaBackend

    be = CudaBackend(dtype=dtype)
    be.ops.split_down = split
    return _model(tiny_dirs["mlx4"], be, slots=1)


@pytest.mark.parametrize("dtype", HALF)
def test_forward_with_split_down_projections(tiny_dirs, dtype):
    """With the down projections split (a prompt window, eager steps, graph replays, and a
    five-row prompt whose last row is taken from the sums) the logits are those of whole
    projections, to rounding; between forwards every accumulator but the last layer's is
    zero; a forward stopped between layers leaves nothing behind."""
    from engine.backends.base import Batch
    from engine.backends.cuda.graphs import DecodeGraphs

    results = []
    for split in (False, True):
        model = _split_model(tiny_dirs, dtype, split)
        be = model.backend
        graphs = DecodeGraphs(be, model)
        graphs.capture(1)
        be.reset_slot(0)
        got = _run(model, graphs)
        if split:
            n = model.config.num_hidden_layers
            last = 2 if n % 2 else (n - 1) % 2
            acc = [be.mlp_acc[i].get() for i in range(3)]
            assert acc[last].any()
            assert all(not a.any() for i, a in enumerate(acc) if i != last)
        be.reset_slot(0)
        got.append(be.to_host(model.forward(Batch.window(0, 0, 5), np.array(PROMPT[:5]))))
        results.append(got)
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


def test_graph_replays_equal_eager_steps_with_split_down(tiny_dirs):
    """Replaying the captured step (accumulators cleared inside the graph) gives the eager
    step's logits bit for bit, step after step."""
    from engine.backends.base import Batch
    from engine.backends.cuda.graphs import DecodeGraphs

    outs = []
    for use_graph in (False, True):
        model = _split_model(tiny_dirs, "bfloat16", True)
        be = model.backend
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
