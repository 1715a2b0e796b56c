"""The sampling kernels' wrappers (sample.cu): the greedy pick, positions, the presence
penalty's bitmap and the top-k / top-p draw. A mixin of `Ops`, whose `run` launches them and
whose `wide_sampler` and `split_draw_min` choose the draw's form."""

from __future__ import annotations

import numpy as np

from engine.backends.cuda.gemv import _cdiv
from engine.backends.cuda.launch import or_null

i32, f32 = np.int32, np.float32
# The split draw's grid and each block's candidate slots (DRAW_NB, DRAW_CAP in sample.cu).
DRAW_NB, DRAW_CAP = 128, 64


def draw_buffers() -> tuple:
    """The split draw's candidates (one row at a time), zeroed: values float32 and ids int32
    of DRAW_NB * DRAW_CAP slots, and each block's count (uint32, DRAW_NB); Ops.sample's cand."""
    import cupy

    n = DRAW_NB * DRAW_CAP
    return cupy.zeros(n, cupy.float32), cupy.zeros(n, cupy.int32), cupy.zeros(DRAW_NB, cupy.uint32)


class SampleMixin:
    def argmax(self, logits, nvalid, out, work=None):
        """out[s] = argmax of logits[s, :nvalid]. With `work` (two zeroed uint64 per row, left
        zeroed) each row is split over up to 128 blocks; without it, one block per row."""
        args = (logits, i32(logits.shape[1]), i32(nvalid), out)
        if work is None or work.size < 2 * logits.shape[0]:
            self.run("sample.cu", "argmax_rows", (logits.shape[0],), (1024,), args)
            return
        nb = max(1, min(128, _cdiv(nvalid, 2048)))
        self.run("sample.cu", "argmax_split", (nb, logits.shape[0]), (256,), (*args, work))

    def advance(self, pos, n):
        self.run("sample.cu", "advance_positions", (_cdiv(n, 256),), (256,), (pos, i32(n)))

    def mark_seen(self, seen, ids, clear: bool) -> None:
        """Clear `seen` (one row's bitmap of ids) if asked, then set the bits of `ids`."""
        n = 0 if ids is None else ids.size
        args = (seen, i32(seen.size), or_null(ids), i32(n), i32(clear))
        self.run("sample.cu", "mark_seen", (1,), (1024,), args)

    def draw_candidates(self, logits, nvalid, top_k, seen, penalty, cand) -> None:
        """The split draw's first half (sample.cu): each of DRAW_NB blocks keeps its stretch's
        candidates for the top_k of one row in `cand`."""
        self.run(
            "sample.cu",
            "draw_candidates",
            (DRAW_NB,),
            (256,),
            (logits, i32(nvalid), i32(top_k), or_null(seen), f32(penalty)) + tuple(cand),
        )

    def sample(
        self,
        logits,
        nvalid,
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
        """The draw (sample.cu). cand: (values float32, ids int32, counts uint32) of
        DRAW_NB * DRAW_CAP, DRAW_NB, DRAW_NB slots, for the split draw where it applies."""
        wide = self.wide_sampler and logits.data.ptr % 16 == 0 and logits.strides[0] % 16 == 0
        split = (
            wide
            and cand is not None
            and logits.shape[0] == 1
            and top_k <= 32
            and 0 < self.split_draw_min <= nvalid
        )
        if split:
            self.draw_candidates(logits, nvalid, top_k, seen, penalty, cand)
        self.run(
            "sample.cu",
            f"sample_topk_topp<{'true' if wide else 'false'}>",
            (logits.shape[0],),
            (1024,),
            (
                logits,
                i32(logits.shape[1]),
                i32(nvalid),
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
