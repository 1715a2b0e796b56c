"""What a drafting verify keeps so that a rejected draft rolls back exactly (host backend).

A verify (engine/drafting.py) runs the last token and k drafts as one window of k + 1 rows
(`Segment.keep`). Attention needs nothing to roll back: a later row never reads a KV entry
past its own position, and the next forward overwrites the rejected rows' entries. The
DeltaNet layers do: their conv and recurrent state cannot be cut back. So, per DeltaNet
layer and slot, the verify keeps

    history   [K-1+k+1, C]    the conv state it started from, then its rows' conv inputs
    states    [k, Hv, dk, dv] the recurrent state after each of its first k rows (fp32)

and `rewind(slot, n)` puts back the state after its first n rows: conv = history[n:n+K-1],
recurrent = states[n-1] (n = k + 1, every row accepted, is the state as the window left it).
The recurrence runs token by token, as a decode step's does, so the kept states are the
ones a plain decode would have reached.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends import gdn
from engine.model_config import ModelConfig


class VerifyRows:
    """Kept verify rows of every DeltaNet layer, for `slots` streams of up to `tokens`
    drafts (verifies of up to tokens + 1 rows)."""

    def __init__(self, config: ModelConfig, slots: int, tokens: int) -> None:
        c = config
        self.tokens = tokens
        self.taps = c.linear_conv_kernel_dim - 1
        hist = (slots, self.taps + tokens + 1, c.conv_dim)
        rec = (slots, tokens, c.linear_num_value_heads, c.linear_key_head_dim)
        rec += (c.linear_value_head_dim,)
        self.history = [np.zeros(hist, np.float32) for _ in c.linear_layers]
        self.states = [np.zeros(rec, np.float32) for _ in c.linear_layers]
        self.kept: dict[int, int] = {}  # slot -> rows of its last verify

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (*self.history, *self.states))

    def scan(
        self, layer: int, slot: int, history: np.ndarray, q, k, v, g, beta, state
    ) -> np.ndarray:
        """The delta rule over a verify's rows (as `gdn.recurrent`), keeping the state after
        each row; `history` is the conv state followed by the rows' conv inputs."""
        T = q.shape[0]
        if T > self.tokens + 1:
            raise ValueError(f"a verify of {T} rows keeps at most {self.tokens + 1}")
        self.history[layer][slot, : len(history)] = history
        out = np.empty((T, *v.shape[1:]), np.float32)
        for t in range(T):
            rows = slice(t, t + 1)
            out[rows] = gdn.recurrent(q[rows], k[rows], v[rows], g[rows], beta[rows], state)
            if t < self.tokens:
                self.states[layer][slot, t] = state
        self.kept[slot] = T
        return out

    def rewind(self, conv: list[Any], recurrent: list[Any], slot: int, rows: int) -> None:
        """Make each layer's conv and recurrent state of `slot` the one after the first
        `rows` rows of its last verify."""
        kept = self.kept.get(slot, 0)
        if not 0 < rows <= kept:
            raise ValueError(f"slot {slot} kept {kept} verify rows; cannot rewind to {rows}")
        if rows == kept:
            return  # every row stays: the state is the window's own
        for layer in range(len(conv)):
            conv[layer][slot] = self.history[layer][slot, rows : rows + self.taps]
            recurrent[layer][slot] = self.states[layer][slot, rows - 1]
        self.kept[slot] = rows
