"""The fused prefill attention (`attn_prefill`, attn_prefill.cu) against the unfused products
(cuBLAS scores, `softmax_causal`, cuBLAS values, `attn_gate`) and the numpy reference: in bf16
and fp16, head sizes 64 and 256, windows that start at 0 and past it, row counts that end
inside a block's 64 rows and inside a tile's 32 keys, two streams' segments in one batch,
and over the 8-bit KV cache. Run with -s for the timing lines: one layer's attention for a
512-row window of the 4B (16 query heads, 4 KV heads, head_dim 256) at several starts,
fused and unfused (kernel figures, not the product's speed)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.backends.numpy_backend import NumpyBackend
from engine.config import EngineSettings
from engine.model_config import parse_config
from tests.device.test_kernels import TOL, _rel, _round, _up


def _config(hq: int, hkv: int, hd: int):
    from engine.testing.synth import SHAPES, text_config

    return parse_config(
        text_config(
            dict(SHAPES["tiny"], num_attention_heads=hq, num_key_value_heads=hkv, head_dim=hd)
        )
    )


def _backend(dtype: str, kv: str = "bf16"):
    from engine.backends.cuda.backend import CudaBackend

    return CudaBackend(settings=EngineSettings(kv_cache=kv), dtype=dtype)


BATCHES = [
    [Batch.window(0, 0, 1), Batch.window(0, 1, 100), Batch.window(0, 101, 64)],
    [Batch.window(1, 0, 300), Batch.window(1, 300, 213)],
    [Batch((Batch.window(0, 0, 31).segments[0], Batch.window(2, 0, 97).segments[0]))],
    [Batch.window(2, 0, 513), Batch.step([(2, 513)])],
]


def _norms(hd: int, rng) -> tuple[np.ndarray, np.ndarray]:
    return tuple((1 + 0.1 * rng.standard_normal(hd)).astype(np.float32) for _ in range(2))


def _run(be, c, batches, seed: int, fused: bool) -> list:
    """(output, inputs) of each batch's attention, in order, from fresh slots; the inputs
    are (qg, k, v, q_norm, k_norm) on the host."""
    import cupy

    be.attn._fused = None if fused else ("", 0)
    for slot in range(3):
        be.reset_slot(slot)
    rng = np.random.default_rng(seed)
    Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    norms = _norms(hd, rng)
    qn, kn = (cupy.asarray(n) for n in norms)
    outs = []
    for batch in batches:
        R = batch.rows
        qg = _round(be, rng.standard_normal((R, Hq * 2 * hd)).astype(np.float32))
        k = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32))
        v = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32))
        be.prepare(batch, np.zeros(R, np.int32))
        y = be.attention(0, _up(be, qg), _up(be, k), _up(be, v), qn, kn, batch)
        outs.append((be.to_host(y), (qg, k, v, *norms)))
    return outs


@pytest.mark.parametrize("kv", ["bf16", "int8"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("hq,hkv,hd", [(4, 2, 64), (16, 4, 256), (8, 1, 256)])
@pytest.mark.parametrize("case", range(len(BATCHES)))
def test_fused_equals_unfused_and_numpy(dtype, hq, hkv, hd, case, kv):
    c = _config(hq, hkv, hd)
    be = _backend(dtype, kv)
    be.alloc_state(c, 3, 1024)
    be.vocab_rows = c.vocab_size
    assert be.attn.fused_prefill()[0] == f"attn_prefill<{hd},4,2>"
    fused = _run(be, c, BATCHES[case], seed=case, fused=True)
    plain = _run(be, c, BATCHES[case], seed=case, fused=False)
    ref = NumpyBackend(EngineSettings(backend="numpy", kv_cache=kv))
    ref.alloc_state(c, 3, 1024)
    for batch, (y, inputs), (z, _) in zip(BATCHES[case], fused, plain, strict=True):
        r = ref.attention(0, *inputs, batch)
        assert _rel(y, z) < TOL[dtype], ("fused vs unfused", batch.segments)
        assert _rel(y, r) < 3 * TOL[dtype], ("fused vs numpy", batch.segments)


def test_4b_window_timing():
    """One full-attention layer's prefill attention for 512 rows of the 4B at several starts:
    fused and unfused, milliseconds (best of 5)."""
    import cupy

    c = _config(16, 4, 256)
    be = _backend("bfloat16")
    be.alloc_state(c, 1, 8192)
    be.vocab_rows = c.vocab_size
    rng = np.random.default_rng(0)
    R, hd = 512, 256
    qg = _up(be, rng.standard_normal((R, 16 * 2 * hd)).astype(np.float32))
    k = _up(be, rng.standard_normal((R, 4 * hd)).astype(np.float32))
    v = _up(be, rng.standard_normal((R, 4 * hd)).astype(np.float32))
    qn = cupy.ones(hd, cupy.float32)
    for start in (0, 2048, 7680):
        batch = Batch.window(0, start, R)
        times = {}
        for fused in (True, False):
            be.attn._fused = None if fused else ("", 0)
            best = float("inf")
            for _ in range(5):
                be.prepare(batch, np.zeros(R, np.int32))
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                e0.record(be.stream)
                be.attention(0, qg, k, v, qn, qn, batch)
                e1.record(be.stream)
                e1.synchronize()
                best = min(best, cupy.cuda.get_elapsed_time(e0, e1))
            times[fused] = best
        print(
            f"\n[attn_prefill, 4B layer, 512 rows from {start}] fused {times[True]:.3f} ms, "
            f"unfused {times[False]:.3f} ms ({times[False] / times[True]:.1f}x)"
        )
