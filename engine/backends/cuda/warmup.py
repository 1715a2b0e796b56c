"""What warm-up runs besides the decode steps, so that a request compiles, loads, tunes and
creates nothing (invariant 4). `CudaBackend.warm_up` runs the first window and each batch
size's step, captures and tunes the steps, then calls `warm_requests`, which runs on slot 0
(and the others for a step of every slot) what a first request would meet:

    windows     the prompt's windows (`window_plan`): every decode-sized one (2 to
                GEMV_MAX_ROWS rows, each row count its own gemv kernels, compiled and tuned for
                it: a chat prompt's last window, from its turn start, is one of these), prompt
                sized ones at doubling rows below max rows (cuBLAS picks its kernels by
                size), and, eager, max-row windows ending at doubling key counts up to the
                context (the attention products over a long prompt's keys)
    logits      a copy to the host (a prompt's last logits, the host sampler's)
    sampling    every kernel of a draw on the device (`warm_sampling`): the presence
                penalty's bitmap, the draw (split over blocks where the vocabulary is large
                enough), on each row of a step of every slot, into the step's picks and into
                a copy of them (the server's steps)
    launch      a reply's steps launched ahead (`launch_step`), greedy and drawn: the graph,
                the draw on its picks, the pinned ring the picks are copied to
    snapshots   a saved state's copy and its restore (the prompt cache), where the plan puts
                saved states on the card and has room for one (`warm_snapshots`)

The one cuBLAS handle of the process (blas.handle) is made by the first window, so a request
on another thread makes none. modules.built() counts the kernel modules a process has made:
tests/device/test_warmup.py checks that a fresh engine's first requests make none.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.base import Batch
from engine.backends.cuda.gemv_plan import GEMV_MAX_ROWS
from engine.sampling import Draw

# Rows of the lazy path's first window (its scratch and workspace hold no more at warm-up).
LAZY_ROWS = 64
# A draw that launches every kernel a device draw can (sampling.py): a presence penalty (the
# app's default) with its bitmap cleared and marked, at a top-k that takes the split draw
# where the vocabulary is large enough (a larger top-k runs the same draw kernel alone).
WARM_DRAWS = (
    dict(temperature=0.7, top_k=20, top_p=0.8, seed=1, penalty=1.5, mark=(0,), clear=True),
)


def first_rows(max_rows: int, context: int, eager: bool) -> int:
    """Rows of warm-up's first window: max rows where the whole scratch is allocated, else
    LAZY_ROWS (a lazy scratch and workspace hold no more before a request grows them)."""
    return min(max_rows, context, max_rows if eager else LAZY_ROWS)


def window_plan(max_rows: int, context: int, eager: bool) -> list[tuple[int, int]]:
    """(start position, rows) of each window `warm_requests` runs on slot 0, after the
    first (`first_rows` rows at position 0): 2 to GEMV_MAX_ROWS rows and doubling rows from
    2 * GEMV_MAX_ROWS below the first's, at position 0; eager, first-sized windows ending at
    2, 4, 8, ... times its rows of keys while that is short of the context, and one ending
    at the context. (One row is a step, warmed with the decode steps.)"""
    top = first_rows(max_rows, context, eager)
    sizes = list(range(2, min(GEMV_MAX_ROWS, top - 1) + 1))
    rows = 2 * GEMV_MAX_ROWS
    while rows < top:
        sizes.append(rows)
        rows *= 2
    out = [(0, r) for r in sizes]
    if eager and top > 1:  # (a window of one row is a step)
        keys = 2 * top
        while keys < context:
            out.append((keys - top, top))
            keys *= 2
        if context > top:
            out.append((context - top, top))
    return out


def draws(slot: int) -> list[Draw]:
    """WARM_DRAWS for the stream in `slot`."""
    return [Draw(**d, slot=slot) for d in WARM_DRAWS]


def warm_requests(be: Any, model: Any, eager: bool) -> None:
    """Everything the module docstring lists, on backend `be` whose decode graphs are
    captured; leaves the slots to the caller to zero."""
    for start, rows in window_plan(be.max_rows, be.state.context, eager):
        model.forward(Batch.window(0, start, rows), np.zeros(rows, np.int32))
    warm_sampling(be, model)
    warm_launch(be)
    warm_snapshots(be)


def warm_sampling(be: Any, model: Any) -> None:
    """Each of `draws` on each row of a step of every slot (rows differ in alignment where
    the vocabulary's width is not a multiple of 16 bytes), into a copy of the step's picks
    (`Engine._next_tokens`, the server's steps) and into the picks themselves (a launched
    step's)."""
    B = be.state.slots
    logits = model.forward(Batch.step([(s, 0) for s in range(B)]), np.zeros(B, np.int32))
    be.to_host(logits)  # as a prompt's last logits and the host sampler's are
    picks = be.frame.meta[0, :B]  # where a captured step writes its greedy tokens
    be.sample_greedy(logits, out=picks)
    for i in range(B):
        for draw in draws(i):
            rows: list = [None] * B
            rows[i] = draw
            be.sample_rows(logits, picks, rows)
            be.sample_rows(logits, picks, rows, in_place=True)


def warm_launch(be: Any) -> None:
    """Two steps launched ahead as a reply launches them (the second fed by the first's
    picks on the device), greedy then drawn, at one stream and at every slot (the pinned
    ring holds the most rows a step has)."""
    if not be.launches_steps:
        return
    for B in sorted({1, be.state.slots}):
        batch = Batch.step([(s, 0) for s in range(B)])
        first = be.launch_step(batch, np.zeros(B, np.int32), [None] * B)
        ahead = be.launch_step(None, None, [draws(s)[0] for s in range(B)])
        first.tokens()
        ahead.tokens()


def warm_snapshots(be: Any) -> None:
    """A one-token save of slot 0 restored and freed, where saved states go on the card
    and the plan's bytes for them (`be.snapshot_room`; None: nothing planned) hold it."""
    room = be.snapshot_room
    if be.state.snapshots_on_host or (room is not None and room < be.snapshot_bytes(1)):
        return
    snapshot = be.save_slot(0, 1)
    try:
        be.restore_slot(0, snapshot)
    finally:
        be.free_snapshot(snapshot)
