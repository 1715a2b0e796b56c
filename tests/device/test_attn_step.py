"""A step's attention with attn_prep's work inside attn_decode (attn_decode_prep) against the
two kernels it replaces: the same outputs and the same KV cache, bit for bit, at lengths that
put the new key at a split's start, inside a warp's run of keys and at a split's end."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Batch
from tests.device.test_kernels import _config, _pair, _round, _up


def _steps(be, c, rng, batches, qn, kn):
    """Each batch's attention output (host fp32) on `be`, inputs drawn from `rng`."""
    import cupy

    Hq, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    outs = []
    for batch in batches:
        R = batch.rows
        qg = _round(be, rng.standard_normal((R, Hq * 2 * hd)).astype(np.float32))
        k = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32) * 3)
        v = _round(be, rng.standard_normal((R, Hkv * hd)).astype(np.float32))
        be.prepare(batch, np.zeros(R, np.int32))
        dev = [_up(be, a) for a in (qg, k, v)]
        outs.append(be.to_host(be.attention(0, *dev, cupy.asarray(qn), cupy.asarray(kn), batch)))
    return outs


@pytest.mark.parametrize("warps", [4, 8])
@pytest.mark.parametrize("splits", [128, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("hq,hkv", [(4, 2), (16, 4), (16, 2)])
def test_the_step_with_its_prep_equals_prep_then_decode(dtype, hq, hkv, splits, warps, monkeypatch):
    import cupy

    from engine.backends.cuda import attention

    monkeypatch.setattr("engine.memory.scratch.ATTN_SPLITS", splits)
    monkeypatch.setattr(attention, "sm_count", lambda: 0 if warps == 4 else 1 << 20)
    # New keys at positions 31, 32, 33 (the end of the first 32-key split, then the start and
    # the inside of the next), 63 to 66 (the same at the second split's end) and 299 to 302;
    # with 4 splits a split holds 75 keys at 300, and the new key falls in a warp's second
    # or later run of keys.
    lengths = (31, 63, 299)
    batches = [Batch.window(s, 0, n) for s, n in enumerate(lengths)]
    batches += [Batch.step([(s, n + t) for s, n in enumerate(lengths)]) for t in range(3)]
    batches += [Batch.step([(1, 66)]), Batch.step([(0, 34), (2, 302)])]
    written = (35, 67, 303)  # each slot's keys once the batches have run
    runs, caches, fused = [], [], []
    real = attention.Attention.decode_prep

    def counted(self, *a, **kw):
        fused.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(attention.Attention, "decode_prep", counted)
    for in_decode in (False, True):
        monkeypatch.setattr(attention, "step_prep_fits", lambda g, h, on=in_decode: on)
        c, be, _ = _pair(dtype, c=_config(hq=hq, hkv=hkv))
        rng = np.random.default_rng(hq + 7 * hkv)
        qn = (1 + 0.1 * rng.standard_normal(c.head_dim)).astype(np.float32)
        kn = (1 + 0.1 * rng.standard_normal(c.head_dim)).astype(np.float32)
        runs.append(_steps(be, c, rng, batches, qn, kn))
        kv = [cupy.asnumpy(x[0]) for x in (be.state.kv_k, be.state.kv_v)]  # layer 0
        caches.append([part[s, :, :n] for part in kv for s, n in enumerate(written)])
    assert len(fused) == len(batches) - len(lengths)  # every step, no window
    for i, (a, b) in enumerate(zip(*runs, strict=True)):
        assert np.array_equal(a, b), (i, batches[i].segments, float(np.abs(a - b).max()))
    for a, b in zip(*caches, strict=True):
        assert np.array_equal(a, b)
