"""Picking tokens on the device (sample.cu): the greedy pick, the positions' advance, the
presence penalty's bitmap and the top-k / top-p draw.

The draw reads each row's logits with 32 a thread in flight (WIDE) where the row is 16-byte
aligned, else one at a time. A draw of one row with top-k <= 32 over a large vocabulary
(`Tuning.split_draw_min_vocab`) first has DRAW_NB blocks each keep their stretch's
candidates (`draw_candidates`); the draw's block then reads those instead of the row.

Buffers (made by `alloc`, kept for the backend's life):

    counter      uint32 [rows]       a draw's position in its seed's stream (unseeded draws)
    argmax_work  uint64 [2 * rows]   the split greedy pick's partials, left zeroed
    picks        int32 [rows]        each decode row's next token (`rows`)
    seen         uint32 [slots, V/32] per slot, a bitmap of the ids its reply has
    draw_cand    the split draw's candidates: values f32 and ids i32 of DRAW_NB * DRAW_CAP
                 slots, and each block's count (uint32, DRAW_NB)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.frame import Frame
from engine.backends.cuda.launch import Kernels, cdiv, or_null
from engine.backends.cuda.tuning import Tuning

# Rows of a decode graph's pick ring (sample.cu's PICK_RING): up to two steps are in flight
# while the host reads a third's picks.
PICK_RING = 4

i32, f32 = np.int32, np.float32
# The split draw's grid and each block's candidate slots (DRAW_NB, DRAW_CAP in sample.cu).
DRAW_NB, DRAW_CAP = 128, 64


def draw_symbol(wide: bool) -> str:
    """The draw's instance: 16-byte loads of a 16-byte aligned row (WIDE), or one by one."""
    return f"sample_topk_topp<{'true' if wide else 'false'}>"


def draw_buffers() -> tuple:
    """The split draw's candidates (one row at a time), zeroed: values float32 and ids int32
    of DRAW_NB * DRAW_CAP slots, and each block's count (uint32, DRAW_NB)."""
    import cupy

    n = DRAW_NB * DRAW_CAP
    return cupy.zeros(n, cupy.float32), cupy.zeros(n, cupy.int32), cupy.zeros(DRAW_NB, cupy.uint32)


class Sampling:
    """Owns sample.cu and its buffers; `frame` is where picks without a given output go."""

    def __init__(self, kernels: Kernels, frame: Frame, tuning: Tuning) -> None:
        self.k, self.frame, self.tuning = kernels, frame, tuning
        self.counter: Any = None
        self.argmax_work: Any = None
        self.picks: Any = None
        self.seen: Any = None
        self.draw_cand: Any = None

    def alloc(self, rows: int, slots: int, vocab_size: int) -> None:
        """The buffers for decode steps of up to `rows` rows over `slots` streams."""
        import cupy

        self.counter = cupy.zeros(rows, cupy.uint32)
        self.argmax_work = cupy.zeros(2 * rows, cupy.uint64)
        self.picks = cupy.zeros(rows, cupy.int32)
        self.seen = cupy.zeros((slots, -(-vocab_size // 32)), cupy.uint32)
        self.draw_cand = draw_buffers()

    @property
    def nbytes(self) -> int:
        if self.counter is None:
            return 0
        small = self.counter.nbytes + self.argmax_work.nbytes + self.picks.nbytes
        return small + self.seen.nbytes + sum(a.nbytes for a in self.draw_cand)

    # ----- the picks ----------------------------------------------------------------------
    def greedy(self, logits: Any, vocab_rows: int, out: Any = None) -> Any:
        """argmax over the real vocabulary of each row, int32 on the device."""
        import cupy

        if out is None:
            out = self.frame.take((logits.shape[0],), cupy.int32)
        self.argmax(logits, min(vocab_rows, logits.shape[1]), out, self.argmax_work)
        return out

    def rows(
        self, logits: Any, greedy: Any, rows: list, vocab_rows: int, in_place: bool = False
    ) -> Any:
        """The next token of each row of a decode step: rows[i] None takes greedy[i] (the
        step's argmax), else the `engine.sampling.Draw` draws from logits[i] (with a presence
        penalty, the slot's bitmap of seen ids updated first). Returns int32 [len(rows)] on
        the device: greedy itself where in_place (the draws overwrite their rows; no
        copies), else a copy."""
        import cupy

        n = len(rows)
        picks = greedy[:n] if in_place else self.picks[:n]
        if not in_place:
            # A device-to-device copy, not CuPy's elementwise copy kernel: that one has a
            # module of its own for each form of its arguments, which a first request could
            # meet after warm-up (invariant 4); `greedy` is a row of `meta` or a carved view.
            if not greedy.flags.c_contiguous or greedy.dtype != picks.dtype:
                raise TypeError(
                    f"Sampling.rows: greedy picks must be contiguous int32 on the device, got "
                    f"{greedy.dtype} with strides {greedy.strides}"
                )
            picks.data.copy_from_device_async(greedy.data, picks.nbytes)
        for i, d in enumerate(rows):
            if d is None:
                continue
            seen = None
            if d.penalty:
                seen = self.seen[d.slot]
                if d.clear or d.mark:
                    ids = cupy.asarray(np.asarray(d.mark, np.int32)) if d.mark else None
                    self.mark_seen(seen, ids, d.clear)
            self.draw(
                logits[i : i + 1],
                min(vocab_rows, logits.shape[1]),
                d.top_k,
                d.top_p,
                d.temperature,
                d.seed,
                None,  # every draw is seeded: nothing carried between calls
                picks[i : i + 1],
                seen,
                d.penalty,
                self.draw_cand,
            )
        return picks

    def sample(
        self,
        logits: Any,
        vocab_rows: int,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
        out: Any = None,
    ) -> Any:
        """top-k (at most 1024; 0 means 1024) then top-p sampling at `temperature`."""
        import cupy

        if temperature <= 0:
            return self.greedy(logits, vocab_rows, out)
        if out is None:
            out = self.frame.take((logits.shape[0],), cupy.int32)
        k = 1024 if top_k <= 0 else min(top_k, 1024)
        self.draw(
            logits,
            min(vocab_rows, logits.shape[1]),
            k,
            top_p,
            temperature,
            seed,
            self.counter,
            out,
            cand=self.draw_cand,
        )
        return out

    # ----- kernels ------------------------------------------------------------------------
    def argmax(self, logits, vocab_rows, out, work=None):
        """out[s] = argmax of logits[s, :vocab_rows]. With `work` (two zeroed uint64 per row,
        left zeroed) each row is split over up to 128 blocks of 2,048 logits (eight loads a
        thread, requested together: one round trip); without it, one block per row."""
        args = (logits, i32(logits.shape[1]), i32(vocab_rows), out)
        if work is None or work.size < 2 * logits.shape[0]:
            self.k.run("sample.cu", "argmax_rows", (logits.shape[0],), (1024,), args)
            return
        nb = max(1, min(128, cdiv(vocab_rows, 2048)))
        self.k.run("sample.cu", "argmax_split", (nb, logits.shape[0]), (256,), (*args, work))

    def advance(self, pos, n, picks, ring):
        """Every position of a decode step one further (a graph's next step), and `picks`
        to row pos[0] % PICK_RING of `ring` (a mapped [PICK_RING, n] int32 array)."""
        self._ring_kernel("advance_positions", pos, n, picks, ring)

    def publish(self, pos, n, picks, ring):
        """`picks` to the ring's row of the step whose positions `pos` advanced last (after
        draws replaced its greedy picks)."""
        self._ring_kernel("publish_picks", pos, n, picks, ring)

    def _ring_kernel(self, symbol, pos, n, picks, ring):
        threads = min(1024, cdiv(n, 32) * 32)  # one block
        self.k.run("sample.cu", symbol, (1,), (threads,), (pos, i32(n), picks, ring))

    def mark_seen(self, seen, ids, clear: bool) -> None:
        """Clear `seen` (one row's bitmap of ids) if asked, then set the bits of `ids`."""
        n = 0 if ids is None else ids.size
        args = (seen, i32(seen.size), or_null(ids), i32(n), i32(clear))
        self.k.run("sample.cu", "mark_seen", (1,), (1024,), args)

    def draw_candidates(self, logits, vocab_rows, top_k, seen, penalty, cand) -> None:
        """The split draw's first half: each of DRAW_NB blocks keeps its stretch's
        candidates for the top_k of one row in `cand`."""
        self.k.run(
            "sample.cu",
            "draw_candidates",
            (DRAW_NB,),
            (256,),
            (logits, i32(vocab_rows), i32(top_k), or_null(seen), f32(penalty)) + tuple(cand),
        )

    def draw(
        self,
        logits,
        vocab_rows,
        top_k,
        top_p,
        temperature,
        seed,
        counter,
        out,
        seen=None,
        penalty=0.0,
        cand=None,
    ):
        """The draw (sample_topk_topp). cand: (values float32, ids int32, counts uint32) of
        DRAW_NB * DRAW_CAP, DRAW_NB * DRAW_CAP, DRAW_NB slots, for the split draw where it
        applies."""
        wide = logits.data.ptr % 16 == 0 and logits.strides[0] % 16 == 0
        split = (
            wide
            and cand is not None
            and logits.shape[0] == 1
            and top_k <= 32
            and self.tuning.split_draw_min_vocab <= vocab_rows
        )
        if split:
            self.draw_candidates(logits, vocab_rows, top_k, seen, penalty, cand)
        self.k.run(
            "sample.cu",
            draw_symbol(wide),
            (logits.shape[0],),
            (1024,),
            (
                logits,
                i32(logits.shape[1]),
                i32(vocab_rows),
                i32(top_k),
                f32(top_p),
                f32(temperature),
                np.uint64(seed),
                or_null(counter),
                out,
                or_null(seen),
                f32(penalty),
            )
            + (tuple(cand) if split else (or_null(None),) * 3),
        )
