"""Which kernel variant runs each decode projection shape, chosen by timing.

Two rounds choose. Per shape, the first launch outside a graph capture times every
candidate once, alone (`ProjectionTuner.rank`), and takes the fastest. At warm-up on a large
card, the decode step's own tuning (graphs.DecodeGraphs.tune) then re-chooses among each
shape's `step_candidates` by the captured step's time, where each launch overlaps its
neighbours as it will in a reply.

The choices are kept per activation dtype for the whole process: two backends (eager and
graphed, or a reload) then run the same variants, sum in the same order and give the same
tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.backends.cuda.launch import l2_bytes, on_stream

# Per dtype: shape key -> the chosen variant.
_CHOICES: dict[str, dict[tuple, tuple]] = {}
# Per dtype: each tuned key's candidates, fastest alone first (DecodeGraphs.tune tries the
# closest ones in the whole step).
_RANKED: dict[str, dict[tuple, list]] = {}
# Per dtype: the decode steps (their choice keys, in order) whose variants the whole-step
# tuning has already chosen: a later load of the same shapes keeps those choices, so the
# same request gets the same tokens in one process.
_STEP_TUNED: dict[str, set[tuple]] = {}


def best_replay_s(graph: Any, stream: Any, reps: int) -> float:
    """Seconds of the fastest of `reps` replays of a captured CUDA graph (timed with events)."""
    import cupy

    best = float("inf")
    for _ in range(reps):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
    return best


class ProjectionTuner:
    """The choices of one activation dtype: `choice` (key -> variant), `ranked` (key ->
    candidates, fastest alone first), `step_tuned` (decode steps already tuned whole), and
    `step_keys`, the keys a graph capture looked up, in order."""

    def __init__(self, dtype: str) -> None:
        self.choice: dict[tuple, tuple] = _CHOICES.setdefault(dtype, {})
        self.ranked: dict[tuple, list] = _RANKED.setdefault(dtype, {})
        self.step_tuned: set[tuple] = _STEP_TUNED.setdefault(dtype, set())
        self.step_keys: list[tuple] = []
        self._l2_flush: Any = None

    def rank(self, key: tuple, cands: list, run: Callable[[tuple], None]) -> tuple:
        """Time `run(candidate)` for each candidate, keep them fastest first under `key` and
        choose the fastest."""
        times = [self.time(lambda c=c: run(c)) for c in cands]
        ranked = [c for _, c in sorted(zip(times, cands, strict=True), key=lambda tc: tc[0])]
        self.ranked[key] = ranked
        self.choice[key] = ranked[0]
        return ranked[0]

    def time(self, run: Callable[[], None], n: int = 8) -> float:
        """GPU ms of n calls of `run`, each after a write that evicts the L2 (weights come
        from memory, as in a decode step), replayed as one CUDA graph; the writes cost the
        same for every candidate, so only the ranking means anything."""
        import cupy

        if self._l2_flush is None:
            self._l2_flush = cupy.empty(max(l2_bytes() * 5 // 4, 1 << 20), cupy.uint8)
        stream = cupy.cuda.get_current_stream()
        if stream.ptr == 0:  # the legacy default stream cannot be captured
            stream = cupy.cuda.Stream(non_blocking=True)
        with on_stream(stream):
            run()  # compile, set attributes, warm
            stream.begin_capture()
            for _ in range(n):
                self._l2_flush.fill(0)
                run()
            graph = stream.end_capture()
            graph.launch(stream)
            return best_replay_s(graph, stream, 2) * 1e3

    def step_candidates(self, key: tuple, keep: int | None) -> list:
        """What the decode step's own tuning (DecodeGraphs.tune) tries for a choice key: the
        `keep` fastest alone (None: all), then every tensor-core variant that requests its
        whole slice at once, before the wait (not pipelined). Timed alone, with nothing
        before them, those rank low; in the step, where each launch's weights are requested
        while the previous kernel ends, they won every layer projection of the 4B when all
        candidates were tried (tools/bench_decode.py --search)."""
        ranked = self.ranked.get(key, [])
        at_once = [c for c in ranked if c[0] == "mma" and not c[4]]
        return list(dict.fromkeys(ranked[:keep] + at_once))
