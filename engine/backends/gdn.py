"""The gated delta rule on the host, two ways: token by token, and in chunks of 64.

Per value head, with state S [dk, dv] (fp32), log-decay g_t <= 0 and write strength b_t:

    S_t = e^{g_t} S_{t-1} + b_t k_t (v_t - e^{g_t} S_{t-1}^T k_t)^T ;   o_t = S_t^T q_t

The chunked form (the WY / UT representation of Yang et al., "Gated Delta Networks") turns
a chunk of C rows into small matrix products. With G the cumulative sum of g inside the
chunk, Gamma[i, j] = e^{G_i - G_j} for i >= j, and S the state entering the chunk:

    A      = strictly_lower(diag(b) K K^T * Gamma)          [C, C]
    T      = (I + A)^-1                                     (unit lower triangular)
    W      = T diag(b) (K * e^G)      U = T diag(b) V       [C, dk], [C, dv]
    V'     = U - W S                                        the chunk's new values
    O      = (Q * e^G) S + lower(Q K^T * Gamma) V'          lower includes the diagonal
    S_next = e^{G_last} S + (K * e^{G_last - G})^T V'

The chunk algebra runs in float64 so that a window computed in chunks and the same rows
computed one step at a time agree to float32 rounding.
"""

from __future__ import annotations

import numpy as np

CHUNK = 64


def recurrent(q, k, v, g, beta, state):
    """Token by token. q, k [T, H, dk]; v [T, H, dv]; g, beta [T, H]; state [H, dk, dv]
    (updated in place). Returns o [T, H, dv] float32."""
    T = q.shape[0]
    out = np.empty((T, *v.shape[1:]), np.float32)
    decay = np.exp(g)
    for t in range(T):
        state *= decay[t][:, None, None]
        kv_mem = np.einsum("hkv,hk->hv", state, k[t])
        delta = beta[t][:, None] * (v[t] - kv_mem)
        state += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", state, q[t])
    return out


def chunked(q, k, v, g, beta, state, chunk: int = CHUNK):
    """Same contract as `recurrent`, in chunks of `chunk` rows (the last may be shorter)."""
    T = q.shape[0]
    out = np.empty((T, *v.shape[1:]), np.float32)
    S = state.astype(np.float64)  # [H, dk, dv]
    for start in range(0, T, chunk):
        rows = slice(start, min(start + chunk, T))
        Q = q[rows].transpose(1, 0, 2).astype(np.float64)  # [H, C, dk]
        K = k[rows].transpose(1, 0, 2).astype(np.float64)
        V = v[rows].transpose(1, 0, 2).astype(np.float64)  # [H, C, dv]
        b = beta[rows].T.astype(np.float64)[:, :, None]  # [H, C, 1]
        G = np.cumsum(g[rows].T.astype(np.float64), axis=1)  # [H, C]
        C = G.shape[1]
        lower = np.tril(np.ones((C, C), bool))
        gamma = np.where(lower, np.exp(np.where(lower, G[:, :, None] - G[:, None, :], 0)), 0)
        A = np.tril((b * K) @ K.transpose(0, 2, 1) * gamma, -1)
        eG = np.exp(G)[:, :, None]  # [H, C, 1]
        rhs = np.concatenate([b * K * eG, b * V], axis=2)  # [H, C, dk + dv]
        WU = unit_lower_inverse(np.eye(C) + A) @ rhs
        W, U = WU[..., : K.shape[2]], WU[..., K.shape[2] :]
        V_new = U - W @ S  # [H, C, dv]
        O = (Q * eG) @ S + ((Q @ K.transpose(0, 2, 1)) * gamma) @ V_new
        out[rows] = O.transpose(1, 0, 2)
        last = G[:, -1]  # [H]
        tail = np.exp(last[:, None] - G)[:, :, None]  # [H, C, 1]
        S = np.exp(last)[:, None, None] * S + (K * tail).transpose(0, 2, 1) @ V_new
    state[...] = S
    return out


def unit_lower_inverse(L: np.ndarray) -> np.ndarray:
    """The inverse of unit lower triangular matrices `L [..., n, n]`, by halves: the two
    diagonal blocks inverted alone, the corner from them (-B^-1 C A^-1). A general solve
    does not know the shape: this takes about a third of its time for a chunk of 64."""
    n = L.shape[-1]
    if n <= 8:  # rows one at a time: row i of the inverse from the rows above it
        X = np.zeros_like(L)
        X[..., range(n), range(n)] = 1.0
        for i in range(1, n):
            X[..., i, :i] = -np.einsum("...j,...jk->...k", L[..., i, :i], X[..., :i, :i])
        return X
    h = n // 2
    top, bottom = unit_lower_inverse(L[..., :h, :h]), unit_lower_inverse(L[..., h:, h:])
    X = np.zeros_like(L)
    X[..., :h, :h], X[..., h:, h:] = top, bottom
    X[..., h:, :h] = -bottom @ L[..., h:, :h] @ top
    return X
