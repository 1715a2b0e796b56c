import numpy as np
import pytest

from engine.backends import gdn


def inputs(T, H=4, dk=16, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(T, H, dk)).astype(np.float32)
    k = rng.normal(size=(T, H, dk)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)  # the model l2-normalises k (and q)
    q /= np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(dk)
    v = rng.normal(size=(T, H, dv)).astype(np.float32)
    g = -rng.uniform(0.0, 1.5, size=(T, H)).astype(np.float32)
    beta = rng.uniform(0.05, 1.0, size=(T, H)).astype(np.float32)
    state = rng.normal(size=(H, dk, dv)).astype(np.float32) * 0.3
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T", [1, 2, 63, 64, 65, 200])
def test_chunked_equals_recurrent(T):
    q, k, v, g, beta, state = inputs(T)
    s_rec, s_chk = state.copy(), state.copy()
    o_rec = gdn.recurrent(q, k, v, g, beta, s_rec)
    o_chk = gdn.chunked(q, k, v, g, beta, s_chk)
    scale = np.abs(o_rec).max()
    assert np.abs(o_chk - o_rec).max() <= 1e-5 * scale
    assert np.abs(s_chk - s_rec).max() <= 1e-5 * np.abs(s_rec).max()
    assert s_chk.dtype == np.float32


def test_chunks_compose_across_calls():
    """A prompt split into windows at any row gives the same state as one window."""
    q, k, v, g, beta, state = inputs(150, seed=1)
    whole, parts = state.copy(), state.copy()
    o = gdn.chunked(q, k, v, g, beta, whole)
    o1 = gdn.chunked(q[:70], k[:70], v[:70], g[:70], beta[:70], parts)
    o2 = gdn.chunked(q[70:], k[70:], v[70:], g[70:], beta[70:], parts)
    np.testing.assert_allclose(np.concatenate([o1, o2]), o, atol=1e-5 * np.abs(o).max())
    np.testing.assert_allclose(parts, whole, atol=1e-5 * np.abs(whole).max())


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 33, 64])
def test_the_unit_lower_inverse_is_the_solves(n):
    """The chunk's (I + A)^-1 by halves equals a general solve's, on batches of them."""
    rng = np.random.default_rng(n)
    L = np.eye(n) + np.tril(rng.normal(size=(3, 2, n, n)) * 0.3, -1)
    got = gdn.unit_lower_inverse(L)
    np.testing.assert_allclose(got, np.linalg.solve(L, np.broadcast_to(np.eye(n), L.shape)),
                               atol=1e-12)  # fmt: skip
    assert np.allclose(np.triu(got, 1), 0) and np.allclose(np.diagonal(got, 0, -2, -1), 1)
