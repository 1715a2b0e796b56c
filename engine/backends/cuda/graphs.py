"""Decode-step CUDA graphs: captured per batch size (see below for the second one a long
context adds), replayed every step.

Capture rules this module relies on (see the backend): every buffer the step touches is
allocated before capture (weights arena, state, `meta`, the scratch block); the forward
carves its buffers from the scratch block with a bump allocator that restarts at offset 0,
so capture and replay see the same addresses; per-step values (ids, positions, slots) live
in `meta` and are written before launch. The graph ends with greedy selection into the ids
row of `meta` and advances every position by one, so `replay_next` decodes the next token
with no host round trip.

`launch()` runs a step without waiting for it, and the next step can be launched, fed by
its picks on the device, before the host reads them (`Pending.tokens`). The graph's last
kernel writes the picks (greedy, or drawn after it by `publish`) into a ring of pinned host
memory mapped into the device, one row a step (row: the position of the step's first row,
modulo PICK_RING), where the host reads them once the step's event has passed: no copy
between two steps' graphs (a copy and its event there cost about 10 us a step on the H200).

`tune()` re-chooses the projections' kernel variants by the captured step's own time (the
per-shape tuner times each one alone, where the overlap with its neighbours is missing).

Where the context admits more than SHORT_SPLITS attention splits a KV head, a batch size
gets a second graph for steps whose rows are all short enough that those splits cover them
(up to 1,024 keys): its attention grid has SHORT_SPLITS splits, not the context's up to 128,
most of which would find no keys and exit. The two give the same splits and the same
results; the host knows each step's longest row and launches the one that fits.

A drafting verify (`Batch.verify`: one stream's k + 1 rows, every row's logits and final
hidden state) gets a graph too, one per (slot, rows), captured after its first eager run
(`verify`). Its attention runs row by row on the decode kernels and its DeltaNet layers read
the layout from `meta`, so a replay at any position writes `meta` and launches; the rows a
slot keeps for `rewind` are recorded on the host at each replay.

`teardown()` drops every graph; the backend calls it before freeing or moving a buffer a
graph points into (scratch growth, meta growth, new state). `restore()` captures again the
batch sizes a teardown dropped; the backend calls it right after a grow, before the forward
that grew runs. Decode steps never grow the scratch after warm-up (a step needs one row a
stream, which warm-up's scratch holds), so on the lazy path a grow happens at a prompt's
chunk and the decode steps after it replay graphs rather than capture them. A graph
missing at a step (no warm-up, or a capture refused for lack of memory) is captured there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.base import Backend, Batch
from engine.backends.cuda.host_table import carve
from engine.backends.cuda.launch import on_stream
from engine.backends.cuda.sampling import PICK_RING
from engine.errors import GraphCaptureFailed, RequestRefused
from engine.memory.decision import streams_text
from engine.memory.pool import is_out_of_memory
from engine.memory.scratch import decode_splits

# Warm-up tunes the step by its own time only where a step is this short (a large GPU, where
# the kernels' overlap decides); on a small card the step is bound by memory bandwidth.
TUNE_MAX_STEP_S = 0.006
# ...and for at most this long (on the H200 the 4B's tuning takes about 3.5 s; a card with a
# slower step stops early, with the choices that made the step faster so far).
TUNE_BUDGET_S = 6.0
# The attention splits a KV head in the graph for short rows. On the H200 the 4B's step at an
# 8K context took 1.5% longer with the grid of 128 splits than with 32 at a 600-key reply:
# the empty blocks cost their launch.
SHORT_SPLITS = 32


class Pending:
    """A launched decode step's picks, on their way to host memory."""

    def __init__(self, event: Any, host: np.ndarray):
        self.event, self.host = event, host

    def tokens(self) -> list[int]:
        """Wait for the copy; each row's picked token."""
        self.event.synchronize()
        return [int(t) for t in self.host]


_LAST_KEPT_ROW: Any = None


def last_kept_row(ids: Any, picks: Any, rows: int, x: Any, width: int, out: Any) -> None:
    """out[0] = x[a], a the drafts a greedy verify keeps: ids[1..a] equal picks[0..a-1]
    (`speculative.accept_greedy`). Every thread finds a itself (at most 3 compares), so
    the row the head's LM head reads is chosen on the device, inside a captured graph."""
    global _LAST_KEPT_ROW
    import cupy

    if _LAST_KEPT_ROW is None:  # an elementwise copy: no library call picks a row by data
        _LAST_KEPT_ROW = cupy.ElementwiseKernel(
            "raw int32 ids, raw int32 picks, int32 rows, raw T x, int32 width",
            "T out",
            "int a = 0; while (a + 1 < rows && ids[a + 1] == picks[a]) ++a;"
            " out = x[a * width + i];",
            "snug_last_kept_row",
        )
    _LAST_KEPT_ROW(ids, picks, np.int32(rows), x, np.int32(width), out)


@dataclass
class _Captured:
    graph: Any
    logits: Any  # [B, V] view into scratch
    tokens: Any  # [B] int32 view into meta (the next step's input ids)
    short: _Captured | None = None  # the same step for rows of at most short_limit() keys
    hidden: Any = None  # a verify's final hidden states [R, H] (view into scratch)
    inputs: Any = None  # the MTP head's hidden-state input, copied in before each replay
    buffers: tuple = ()  # other buffers the graph reads or writes, alive as long as it is


class DecodeGraphs:
    """Owns the decode graphs of one (backend, model) pair."""

    def __init__(self, backend: Any, model: Any):
        self.be = backend
        self.model = model
        self.graphs: dict[int, _Captured] = {}
        self.warmed: set[int] = set()  # batch sizes whose kernels are compiled and tuned
        self._rings: dict[int, tuple[np.ndarray, Any]] = {}  # batch size -> mapped picks
        self._row0: dict[int, int] = {}  # batch size -> its last step's row 0 position
        self.keys: dict[int, list[tuple]] = {}  # batch size -> projection choice keys used
        self.lengths: dict[int, int] = {}  # batch size -> longest row (keys) of its last step
        self.lost: set[int] = set()  # batch sizes torn down since their capture
        self.captures = 0  # graphs captured, and graph launches (tests count both)
        self.replays = 0
        self.verifies: dict[tuple[int, int], _Captured] = {}  # (slot, rows) -> its verify
        self.heads: dict[tuple[int, int, bool], _Captured] = {}  # (slot, rows, logits)
        self.follows: dict[tuple[int, int], _Captured] = {}  # (slot, rows) -> verify_follow
        backend.graphs = self

    def teardown(self) -> None:
        self.lost |= set(self.graphs)
        self.graphs.clear()
        self.verifies.clear()  # captured again at their next verify
        self.heads.clear()
        self.follows.clear()

    def restore(self) -> None:
        """Capture again every batch size a teardown dropped (the slots are placeholders, as
        in `capture`). A capture refused for lack of memory leaves its size to be tried
        again at the next forward that prepares, or captured at its next step."""
        pending, self.lost = sorted(self.lost), set()  # a capture prepares a forward too
        for B in pending:
            if B in self.graphs or B not in self.warmed:
                continue  # captured since, or never warmed (its warm-up would write slots)
            try:
                self.capture(B)
            except RequestRefused:
                self.lost.add(B)

    def warm(self, batch_size: int) -> None:
        """Run one eager step of `batch_size` rows on slots 0.. (compiles every kernel and
        tunes the projections for this size, which must not happen inside a capture), then
        zero those slots. Only for slots that hold no live stream: at load, or in tests."""
        be, B = self.be, batch_size
        if B > be.frame.meta.shape[1]:
            be.frame.alloc_meta(B)
        self.model.forward(Batch.step([(s, 0) for s in range(B)]), np.zeros(B, np.int32))
        for slot in range(B):
            be.reset_slot(slot)
        self.warmed.add(B)

    def short_limit(self) -> int:
        """The longest row (keys, the new one included) the graph for short rows takes; 0
        where the context has no more than SHORT_SPLITS splits (one graph does for all)."""
        least, splits = decode_splits(self.be.state.context)
        return least * SHORT_SPLITS if splits > SHORT_SPLITS else 0

    def capture(self, batch_size: int, short_only: bool = False) -> None:
        """Capture the decode step of `batch_size` rows, and its graph for short rows where
        short_limit() allows (`short_only`: that one again, the other kept; for tuning).
        Capturing executes nothing, so the slots named in the captured batch are
        placeholders; replay writes the real ones. GraphCaptureFailed where CUDA has no
        memory for a graph (nothing stored: the step before it still replays)."""
        B = batch_size
        try:
            if B not in self.warmed:
                self.warm(B)
            short = self._capture(B, SHORT_SPLITS) if self.short_limit() else None
            if not (short_only and short and B in self.graphs):
                self.graphs[B] = self._capture(B, None)
        except Exception as exc:  # no graph is half-stored: a failure changes nothing
            if not is_out_of_memory(exc):
                raise
            raise GraphCaptureFailed(
                f"the decode step of {streams_text(B)} could not be captured as a CUDA graph: "
                f"no memory for it ({exc}). The graphs already captured and every stream's "
                "state are kept, and the next step tries again; lower the context or the "
                "number of streams, or raise the memory reserve (SNUG_MEMORY_RESERVE_GIB) "
                "to leave the driver room"
            ) from exc
        self.graphs[B].short = short

    def _capture(self, B: int, splits: int | None) -> _Captured:
        be = self.be
        batch = Batch.step([(s, 0) for s in range(B)])
        self._ring(B)  # made before the capture starts: the graph writes into it

        def run(ids: np.ndarray) -> tuple[Any, Any]:
            logits = self.model.forward(batch, ids)
            tokens = be.frame.meta[0, :B]
            be.sample_greedy(logits, out=tokens)
            be.sampling.advance(be.frame.meta[1], B, tokens, self._rings[B][1])
            return logits, tokens

        graph, (logits, tokens) = self._record(batch, run, splits)
        self.keys[B] = list(dict.fromkeys(be.projections.tuner.step_keys))
        return _Captured(graph, logits, tokens)

    def _pick(self, B: int, longest: int) -> _Captured:
        """The graph for a step of B rows whose longest row has `longest` keys."""
        self.lengths[B] = longest
        self.replays += 1
        cap = self.graphs[B]
        return cap.short if cap.short is not None and longest <= self.short_limit() else cap

    def replay(self, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """Run one decode step for `batch` (one row per stream); return (logits, tokens)."""
        assert batch.is_step
        B = batch.rows
        if B not in self.graphs:
            self.capture(B)
        be = self.be
        be.stream.use()
        be.write_batch(batch, np.asarray(ids, np.int32))
        positions = batch.positions()
        self._row0[B] = int(positions[0])
        cap = self._pick(B, int(np.max(positions)) + 1)
        cap.graph.launch(be.stream)
        return cap.logits, cap.tokens

    def launch(self, batch: Batch | None, ids: Any, rows: list) -> Pending:
        """Run one decode step without waiting for it. `batch` and `ids` as in `replay`, or
        None: the step after the last one launched for the same streams, fed by its picks on
        the device. rows[i] is None (the step's greedy token) or an `engine.sampling.Draw`
        (`CudaBackend.sample_rows`); a drawn pick replaces the greedy one as the next step's
        input."""
        import cupy

        be = self.be
        B = len(rows)
        if batch is None:
            be.stream.use()
            logits, picks = self.replay_next(B)
        else:
            logits, picks = self.replay(batch, ids)
        host, ring = self._rings[B]
        if any(r is not None for r in rows):  # the draws replace their rows' greedy picks,
            be.sample_rows(logits, picks, rows, in_place=True)  # which the next step reads
            be.sampling.publish(be.frame.meta[1], B, picks, ring)
        event = cupy.cuda.Event()
        event.record(be.stream)
        return Pending(event, host[self._row0[B] % PICK_RING])

    def _ring(self, B: int) -> None:
        """The mapped ring a B-row step's graph writes its picks into (kept as long as the
        graphs: they point into it)."""
        if B not in self._rings:
            use = ("a decode step's picks", "free host memory")
            (host,), (device,) = carve([((PICK_RING, B), np.int32)], use)
            self._rings[B] = host, device

    def step_seconds(self, batch_size: int, replays: int = 20, rounds: int = 2) -> float:
        """Seconds per step of `batch_size` rows: the best of `rounds` runs of `replays`
        chained replays from position 0 of slots 0.. (warm-up and tools only: it writes
        those slots' state)."""
        import cupy

        B, stream = batch_size, self.be.stream
        best = float("inf")
        for _ in range(rounds):
            self.replay(Batch.step([(s, 0) for s in range(B)]), np.zeros(B, np.int32))
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(stream)
            for _ in range(replays):
                self.replay_next(B)
            e1.record(stream)
            e1.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / 1e3 / replays)
        return best

    def tune(
        self,
        batch_size: int,
        keep: int | None = 3,
        passes: int = 1,
        gain: float = 0.005,
        max_step_s: float | None = None,
        budget_s: float | None = None,
    ) -> tuple[float, float]:
        """Re-choose the step's projection variants by the step's own time: for each choice
        key the step uses, in order, its candidates (ProjectionTuner.step_candidates: the
        `keep` fastest alone, None: all, and the variants that request their weights at
        once) are tried in the captured step, and a change stays where the step gets faster
        by more than `gain` (coordinate descent, `passes` rounds, after trying every key's
        first variant of those at once together; a change kept is timed again, and that
        second time is the one to beat). Skipped where the step takes more than
        `max_step_s`; no candidate is tried once `budget_s` seconds have gone. Writes slots
        0.. (the caller resets them). Returns the step's seconds before and after."""
        B, tuner = batch_size, self.be.projections.tuner
        start = time.perf_counter()
        if B not in self.graphs:
            self.capture(B)
        base = best = self.step_seconds(B)
        if max_step_s is not None and base > max_step_s:
            return base, base
        # First every key at once to its fastest variant (alone) of those that request their
        # weights at once: together they gain more than one key at a time shows.
        seed = {k: c[0] for k in self.keys.get(B, []) if (c := tuner.step_candidates(k, 0))}
        if any(tuner.choice[k] != c for k, c in seed.items()):
            best = self._trial(B, seed, best, gain)
        for _ in range(passes):
            for key in self.keys.get(B, []):
                for cand in tuner.step_candidates(key, keep):
                    if cand == tuner.choice[key]:
                        continue
                    if budget_s is not None and time.perf_counter() - start > budget_s:
                        break
                    best = self._trial(B, {key: cand}, best, gain)
        self._recapture(B)
        return base, self.step_seconds(B)

    def _trial(self, B: int, change: dict, best: float, gain: float) -> float:
        """Try `change` (choice key -> variant) in the captured B-row step: kept where the
        step gets faster than `best` by more than `gain`, else undone. Returns the time to
        beat next: a time that passed is likely one of the lucky ones, so a kept change is
        timed again and later candidates are held to what the step takes, not to its
        luckiest timing."""
        choice = self.be.projections.tuner.choice
        kept = {k: choice[k] for k in change}
        choice.update(change)
        self._recapture(B, short_only=True)
        if self.step_seconds(B) < best * (1 - gain):
            return self.step_seconds(B)
        choice.update(kept)
        return best

    def _recapture(self, B: int, short_only: bool = False) -> None:
        """Capture the B-row step again after its choices changed (an eager step first sets
        up any variant the capture has not launched before). `short_only`: only the graph
        for short rows where there is one, which is the one step_seconds times."""
        self.model.forward(Batch.step([(s, 0) for s in range(B)]), np.zeros(B, np.int32))
        self.capture(B, short_only)

    def verify(self, batch: Batch, ids: np.ndarray) -> tuple[Any, Any]:
        """A drafting verify (one segment that keeps its rows): (every row's logits, every
        row's final hidden state, also in `model.hidden`). The first verify of its (slot,
        rows) runs eagerly and captures its graph after; later ones replay it."""
        (seg,) = batch.segments
        assert seg.keep, "a verify graph replays a verify"
        key = (seg.slot, seg.rows)
        cap = self.verifies.get(key)
        if cap is None:

            def eager() -> tuple[Any, Any]:
                logits = self.model.forward(batch, ids, all_logits=True, hidden=True)
                return logits, self.model.hidden

            return self._first(self.verifies, key, eager, lambda: self._capture_verify(*key))
        self._launch(cap, batch, ids)
        self.be.verify_rows.record(batch)  # the rows its replay keeps, as an eager run notes them
        self.model.hidden = cap.hidden
        return cap.logits, cap.hidden

    def _first(self, store: dict, key: Any, eager: Any, capture: Any) -> Any:
        """The first forward of `key`: `eager()`, then its graph captured into `store`
        (capturing runs nothing, so the eager outputs stay as they are). Where there is no
        memory for the graph, that forward stays eager."""
        out = eager()
        try:
            store[key] = capture()
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
        return out

    def _launch(self, cap: _Captured, batch: Batch, ids: np.ndarray, fill: Any = None) -> None:
        """Replay `cap` for `batch`: its ids (the last from `fill`, on the device) and
        layout into `meta`, then the graph."""
        be = self.be
        be.stream.use()
        be.write_batch(batch, np.asarray(ids, np.int32))
        if fill is not None and len(fill):
            be.frame.meta[0, batch.rows - len(fill) : batch.rows] = fill
        self.replays += 1
        cap.graph.launch(be.stream)

    def _record(self, batch: Batch, run: Any, splits: int | None = None) -> tuple[Any, Any]:
        """(the graph of `run(ids)`, what it returned): a forward of `batch` with placeholder
        ids, prepared first (which sizes the scratch for its rows); each replay rewrites
        `meta` with the real positions and ids. `splits`: the attention's (capture_mode)."""
        be = self.be
        ids = np.zeros(batch.rows, np.int32)
        be.frame.scratch.reset()
        be.prepare(batch, ids)
        be.stream.synchronize()
        stream = be.stream
        with be.capture_mode(splits), on_stream(stream):
            stream.begin_capture()
            try:
                out = run(ids)
            finally:
                graph = stream.end_capture()
        graph.upload(stream)
        self.captures += 1
        return graph, out

    def _capture_verify(self, slot: int, rows: int) -> _Captured:
        """The verify of `rows` rows on `slot` as a graph."""
        batch = Batch.verify(slot, 0, rows)

        def run(ids: np.ndarray) -> tuple[Any, Any]:
            logits = self.model.forward(batch, ids, all_logits=True, hidden=True)
            return logits, self.model.hidden

        graph, (logits, hidden) = self._record(batch, run)
        return _Captured(graph, logits, None, hidden=hidden)

    def head(
        self, head: Any, batch: Batch, ids: np.ndarray, hidden: Any, logits_rows: Any, fill: Any
    ) -> Any:
        """The MTP head's forward (`MtpHead.forward`) where a round of drafting runs it: one
        segment of at most draft_tokens + 1 rows, the logits of its last row or none. The
        first of each (slot, rows, logits) runs eagerly and captures its graph after; later
        ones copy `hidden` into the graph's input and replay it. Others run eagerly.
        `fill` (`Backend.head_forward`) is copied into the ids on the device."""
        be, segs = self.be, batch.segments
        rows = batch.rows
        want = logits_rows is not None
        if (
            len(segs) != 1
            or rows > be.draft_tokens + 1
            or (want and [int(r) for r in logits_rows] != [rows - 1])
        ):
            return head.forward(batch, be.filled(ids, fill), hidden, logits_rows)
        key = (segs[0].slot, rows, want)
        cap = self.heads.get(key)
        if cap is None:
            return self._first(
                self.heads,
                key,
                lambda: head.forward(batch, be.filled(ids, fill), hidden, logits_rows),
                lambda: self._capture_head(head, key, hidden),
            )
        be.stream.use()
        cap.inputs[...] = hidden  # queued on the stream before the replay reads it
        self._launch(cap, batch, ids, fill)
        head.hidden = cap.hidden
        return cap.logits

    def _capture_head(self, head: Any, key: tuple[int, int, bool], like: Any) -> _Captured:
        """The head's forward for `key` as a graph, reading its hidden states from an input
        buffer of its own (shaped like `like`); logits of the last row where asked."""
        import cupy

        slot, rows, want = key
        be = self.be
        inputs = cupy.zeros(like.shape, like.dtype)
        batch = Batch.window(slot, 0, rows)

        def run(ids: np.ndarray) -> tuple[Any, Any]:
            head.forward(batch, ids, inputs, None)
            hidden = head.hidden
            logits = be.linear(hidden[rows - 1 : rows], head.model.head) if want else None
            return logits, hidden

        graph, (logits, hidden) = self._record(batch, run)
        return _Captured(graph, logits, None, hidden=hidden, inputs=inputs)

    def follow(self, head: Any, batch: Batch, ids: np.ndarray, fill: Any) -> Any:
        """`Backend.verify_follow`: the verify, its picks and the head after it as one
        graph per (slot, rows), captured after the first such round, which runs eagerly.
        No wait: the round's one wait is the caller's copy of the result."""
        (seg,) = batch.segments
        key = (seg.slot, seg.rows)
        cap = self.follows.get(key)
        if cap is None:
            return self._first(
                self.follows,
                key,
                lambda: Backend.verify_follow(self.be, self.model, head, batch, ids, fill),
                lambda: self._capture_follow(head, *key),
            )
        self._launch(cap, batch, ids, fill)
        self.be.verify_rows.record(batch)  # the rows its replay keeps, as an eager run notes them
        self.model.hidden = None  # the head's forward reused the verify's buffers
        head.hidden = cap.hidden
        return cap.tokens

    def _capture_follow(self, head: Any, slot: int, rows: int) -> _Captured:
        """The round's verify of `rows` rows on `slot`, its picks written as the ids the
        head's forward over the same positions reads, and the head's picks, as a graph."""
        import cupy

        be = self.be
        batch = Batch.verify(slot, 0, rows)
        window = Batch.window(slot, 0, rows)
        out = cupy.zeros((3, rows), cupy.int32)  # verify ids, verify picks, head pick
        width = self.model.config.hidden_size
        inputs = cupy.zeros((rows, width), be.kernels.act_dtype)
        kept = cupy.zeros((1, width), be.kernels.act_dtype)  # the head's state at the last kept row
        last_kept_row(out[0], out[1], rows, inputs, width, kept)  # compiled before the capture

        def run(ids: np.ndarray) -> tuple[Any, Any]:
            logits = self.model.forward(batch, ids, all_logits=True, hidden=True)
            meta = be.frame.meta[0, :rows]
            out[0] = meta
            be.pick_into(logits, out[1])
            inputs[...] = self.model.hidden  # the head's forward reuses the verify's buffers
            meta[...] = out[1]  # the head reads the verify's picks as its next tokens
            head.forward(window, ids, inputs, None)
            last_kept_row(out[0], out[1], rows, head.hidden, width, kept)
            be.pick_into(be.linear(kept, head.model.head), out[2, :1])
            return out, head.hidden

        graph, (tokens, hidden) = self._record(batch, run)
        return _Captured(graph, None, tokens, hidden=hidden, inputs=inputs, buffers=(kept,))

    def replay_next(self, batch_size: int) -> tuple[Any, Any]:
        """The next step of the same streams, fed by the previous step's greedy tokens.

        The caller keeps positions within the admitted context (no check on this path).
        """
        B = batch_size
        self._row0[B] += 1
        cap = self._pick(B, self.lengths.get(B, 1 << 40) + 1)
        cap.graph.launch(self.be.stream)
        return cap.logits, cap.tokens
