"""Deciding which drafted tokens to keep, so that drafting never changes what is generated.

Greedy: a draft is kept while it equals the token the model itself picks at that row; the
first row whose pick differs gives the reply's next token instead. The reply is the one
decoding without drafts would produce, token for token.

Sampled (speculative sampling: Leviathan et al. 2023, Chen et al. 2023): draft i was drawn
from the draft distribution q_i; it is kept with probability min(1, p_i(d) / q_i(d)), p_i
being the model's distribution at that row (after the request's temperature, top-k, top-p,
min-p and presence penalty, the same transforms applied to q_i). At the first rejection the
next token is drawn from norm(max(0, p_i - q_i)) and the rest are dropped; when every draft
is kept, one more token is drawn from the last row's p. Each token is then distributed
exactly as p: P(x) = q(x) min(1, p(x)/q(x)) + (1 - sum_y min(q(y), p(y))) r(x) = p(x).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accept_greedy(drafts: Sequence[int], picks: Sequence[int]) -> list[int]:
    """The tokens a greedy verify gives: `picks[i]` is the model's pick at row i (row 0 is
    the last token's, so picks[i] decides drafts[i]); the leading drafts that match, then
    the pick of the first row that does not (or of the last row)."""
    if len(picks) != len(drafts) + 1:
        raise ValueError(f"{len(drafts)} drafts need {len(drafts) + 1} picks, not {len(picks)}")
    kept = kept_greedy(drafts, picks)
    return [int(d) for d in drafts[:kept]] + [int(picks[kept])]


def kept_greedy(drafts: Sequence[int], picks: Sequence[int]) -> int:
    """How many leading drafts a greedy verify keeps (`accept_greedy`)."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == picks[kept]:
        kept += 1
    return kept


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)): what a rejection draws from (p itself where p <= q everywhere,
    which only rounding can reach after a rejection)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return p / p.sum() if total <= 0 else r / total


def accept_sampled(
    drafts: Sequence[int],
    p_rows: Sequence[np.ndarray],
    q_rows: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> list[int]:
    """The tokens a sampled verify gives. `p_rows` [k + 1] the model's distributions at the
    verify's rows, `q_rows` [k] those the drafts were drawn from (module docstring)."""
    k = len(drafts)
    if len(p_rows) != k + 1 or len(q_rows) != k:
        raise ValueError(f"{k} drafts need {k + 1} target and {k} draft distributions")
    out: list[int] = []
    for draft, p, q in zip(drafts, p_rows, q_rows, strict=False):
        ratio = p[draft] / q[draft] if q[draft] > 0 else 0.0
        if rng.random() < min(1.0, ratio):
            out.append(int(draft))
            continue
        r = residual(p, q)
        out.append(int(rng.choice(r.size, p=r)))
        return out
    last = p_rows[k]
    out.append(int(rng.choice(last.size, p=last / last.sum())))
    return out


def draw(q: np.ndarray, rng: np.random.Generator) -> int:
    """One draft drawn from the draft distribution `q`."""
    return int(rng.choice(q.size, p=q / q.sum()))
