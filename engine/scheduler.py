"""Continuous batching over the engine's admitted stream slots.

One thread (the engine thread) runs the loop; requests are submitted from any thread and get
their `TokenEvent`s through a per-request sink (a queue by default).

    submit() ──> waiting (bounded: `queue_size`) ──> slot (at most engine.streams running)
                                                      │
    one iteration (`run_once`) on the engine thread:  ▼
      1. admit waiting requests into free slots (restoring a saved prompt state if any)
      2. end cancelled requests: their slot is free before anything else runs
      3. prefill ONE chunk (at most `prefill_chunk` <= max_rows rows, ending where the
         stream's position reaches a multiple of it or the prompt's last turn starts) of
         the oldest request still prefilling; when its prompt is done, its first token is
         picked, its state is saved, and it joins
      4. ONE decode step: one row for every stream that is decoding, in one batch; while
         the same streams decode and no prompt is prefilled or waiting, each step is
         launched before the host reads the last one's tokens (`Backend.launch_step`)

So a decoding stream waits at most one prefill chunk plus its own decode step between two
tokens (`SchedulerStats.longest_gap_s` measures it; tests/engine/test_scheduler.py checks
it). Each request keeps its own sampler, and the chunks of a prompt fall at the absolute
positions where `Engine.prefill` cuts them (with the default `prefill_chunk`), restored
state or not, so a request gets the same tokens as `Engine.generate` gives it alone
(greedy in fp32: exactly; seeded sampling on the host: the same draws).

While a scheduler runs, every generation on its engine goes through it: the engine is not
thread-safe, and only the scheduler's thread touches it.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.base import Batch
from engine.errors import RequestRefused
from engine.request_types import NO_TOKEN, GenerationStats
from engine.sampling import Sampler
from engine.session import Engine, GenerationParams, TokenEvent, _Stream, aligned_chunks
from engine.steps_ahead import draw
from engine.tokenizer import StreamDecoder

Sink = Callable[[Any], None]  # receives TokenEvents, or one exception that ends the request
STOPPED = "the scheduler has stopped; load the model again"


class QueueFull(RequestRefused):
    """Every slot is busy and the waiting queue is full; the request was not taken."""


@dataclass
class SchedulerStats:
    """What the loop has done (read from any thread; written by the engine thread)."""

    steps: int = 0
    prefill_chunks: int = 0
    finished: int = 0
    refused: int = 0
    peak_running: int = 0
    peak_waiting: int = 0  # requests held beyond the streams (the queue's use)
    longest_chunk_s: float = 0.0
    longest_step_s: float = 0.0
    longest_gap_s: float = 0.0  # longest wait of a decoding stream between two of its tokens


class Request:
    """One submitted request. Iterate it for its events (when no sink was given), or
    `cancel()` it from any thread: its slot is free after the loop's next iteration."""

    def __init__(
        self,
        rid: int,
        prompt_ids: list[int],
        params: GenerationParams,
        cancel: threading.Event | None,
        sink: Sink | None,
        ignore_eos: bool,
    ) -> None:
        self.id = rid
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.ignore_eos = ignore_eos
        self.finish_reason: str | None = None
        self._cancel = cancel or threading.Event()
        self._queue: queue.Queue | None = None if sink is not None else queue.Queue()
        self._sink = sink or self._queue.put  # type: ignore[union-attr]
        self.done = threading.Event()
        # Engine-thread state, set at admission.
        self.stream: _Stream | None = None
        self.sampler: Sampler | None = None
        self.decoder: Any = None
        self.todo: list[int] = []  # prompt ids still to prefill
        # Whether the prompt cache was read for the prompt: at its first chunk, not at
        # admission, so that a request admitted beside another with the same prompt
        # restores what that one saved while it read it (the start of the prompt's last
        # turn), prefills going one at a time.
        self.resumed = False
        self.cut: int | None = None  # Engine.turn_start of the prompt
        self.generated: list[int] = []
        self.next_token = NO_TOKEN  # picked, not yet fed to the stream
        self.t0 = self.t_first = self.last_token_at = 0.0

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def __iter__(self) -> Iterator[TokenEvent]:
        if self._queue is None:
            raise TypeError("this request delivers its events to its sink")
        while True:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.finished:
                return


class Scheduler:
    """Serves many requests on one engine: continuous batching, chunked prefill.

    `queue_size`: requests that may wait for a slot beyond the engine's `streams`; one more
    is refused with QueueFull. `prefill_chunk`: rows of prompt per iteration (default and
    at most the engine's max_rows); smaller chunks shorten the longest stall of the
    decoding streams and lengthen the prompt's time to first token.
    """

    # What a refusal for want of room says to change: the command line's flags; the app,
    # which starts its scheduler with its own settings, names those (ScheduledEngine).
    more_room = "raise the queue size (--queue) or the streams (--streams)"

    def __init__(self, engine: Engine, queue_size: int = 16, prefill_chunk: int | None = None):
        for name, value, least in (
            ("queue_size", queue_size, 0),
            ("prefill_chunk", prefill_chunk, 1),
        ):
            if value is None and name == "prefill_chunk":
                continue
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
                default = " (or None: the engine's max_rows)" if least else ""
                raise ValueError(
                    f"Scheduler {name}={value!r} must be a whole number >= {least}{default}"
                )
        self.engine = engine
        self.queue_size = queue_size
        self.prefill_chunk = max(1, min(prefill_chunk or engine.max_rows, engine.max_rows))
        self.stats = SchedulerStats()
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []  # admission order; prefilling and decoding
        self._ahead: tuple[list[Request], Any] | None = None  # a step launched ahead
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ----- any thread ---------------------------------------------------------------------
    def submit(
        self,
        prompt_ids: list[int],
        params: GenerationParams | None = None,
        cancel: threading.Event | None = None,
        sink: Sink | None = None,
        ignore_eos: bool = False,
    ) -> Request:
        """Queue a request; RequestRefused (QueueFull when no room) if it cannot be taken."""
        params = GenerationParams.checked(params)
        if self._stopping:  # (checked again below, under the lock)
            raise RequestRefused(STOPPED)
        prompt_ids = self.engine.checked_prompt(prompt_ids)  # empty, or an id out of range
        context = self.engine.context
        if len(prompt_ids) >= context:
            raise RequestRefused(
                f"the prompt has {len(prompt_ids)} tokens but the context is {context} "
                "(prompt and reply share it); shorten the prompt or raise the context setting"
            )
        request = Request(next(self._ids), prompt_ids, params, cancel, sink, ignore_eos)
        with self._cond:
            if self._stopping:
                raise RequestRefused(STOPPED)
            if len(self._running) + len(self._waiting) >= self.capacity:
                self.stats.refused += 1
                raise QueueFull(
                    f"all {self.engine.streams} streams are busy and {len(self._waiting)} "
                    f"requests already wait (queue size {self.queue_size}); retry later, or "
                    f"{self.more_room}"
                )
            self._waiting.append(request)
            beyond = len(self._running) + len(self._waiting) - self.engine.streams
            self.stats.peak_waiting = max(self.stats.peak_waiting, beyond)
            self._cond.notify()
        return request

    def generate(
        self,
        prompt_ids: list[int],
        params: GenerationParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[TokenEvent]:
        """`Engine.generate`'s shape through the scheduler: stream the request's events.
        Leaving the loop early cancels the request."""
        request = self.submit(prompt_ids, params, cancel)
        try:
            yield from request
        finally:
            request.cancel()

    @property
    def capacity(self) -> int:
        """The requests it holds at once: one a stream, and the queue."""
        return self.engine.streams + self.queue_size

    @property
    def running(self) -> int:
        return len(self._running)

    def working(self) -> list[Request]:
        """The requests holding a stream now (a copy: the engine thread changes the list);
        for reports such as llama.cpp's /slots. Read their fields, never change them."""
        return list(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> Scheduler:
        """Start the engine thread (the only thread that touches the engine from now on)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="snug-scheduler", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the loop. Requests their callers cancelled end as cancelled; the others,
        still queued or running, end with RequestRefused (STOPPED): a reply the scheduler
        stopped is not one that ended, and a server's client is told so."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            self._settle_ahead()
        self._drop_cancelled()
        with self._cond:
            left, self._waiting = [*self._running, *self._waiting], deque()
        for request in left:
            self._fail(request, RequestRefused(STOPPED))
            request.cancel()  # whoever still reads it stops

    def _settle_ahead(self) -> None:
        """At the close: the step launched ahead ends before its requests are told and the
        engine may unload (its picks are not taken: nobody reads them now)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            try:
                ahead[1].tokens()
            except Exception:  # noqa: BLE001 - the requests are refused at the close anyway
                pass

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- the engine thread --------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self._running):
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                self.run_once()
            except Exception as exc:  # a bug here must not leave clients waiting forever
                for request in list(self._running):
                    self._fail(request, exc)

    def run_once(self) -> bool:
        """One iteration: admit, end cancelled requests, one prefill chunk, one decode step.
        Call it on the engine thread only (tests call it without `start`). Returns whether
        anything ran."""
        self._admit()
        self._drop_cancelled()
        chunk = self._prefill_one()
        step = self._decode_one()
        return chunk or step

    def _admit(self) -> None:
        while len(self._running) < self.engine.streams:
            with self._cond:
                if not self._waiting:
                    return
                request = self._waiting.popleft()
                # Counted as running from here on, so that `running + waiting` never
                # reads 0 while a slot is being taken or given back.
                self._running.append(request)
            if request.cancelled:
                self._finish(request, NO_TOKEN, "cancelled")
                continue
            try:
                request.sampler = self.engine._sampler(request.params, request.prompt_ids)
                request.decoder = StreamDecoder(self.engine.tokenizer)
                request.stream = self.engine._open_stream()
                request.todo = list(request.prompt_ids)  # until the cache is read
                request.cut = self.engine.turn_start(request.prompt_ids)
            except Exception as exc:
                self._fail(request, exc)
                continue
            request.t0 = time.perf_counter()
            self.stats.peak_running = max(self.stats.peak_running, len(self._running))

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._running if r.cancelled]:
            self._finish(request, NO_TOKEN, "cancelled")
        with self._cond:
            gone = [r for r in self._waiting if r.cancelled]
            for request in gone:
                self._waiting.remove(request)
        for request in gone:
            self._finish(request, NO_TOKEN, "cancelled")

    def _prefill_one(self) -> bool:
        """Prefill one chunk of the oldest request still prefilling; pick its first token
        when the prompt is done."""
        request = next((r for r in self._running if r.todo), None)
        if request is None:
            return False
        self._drain()  # the prefill's forward rewrites what a launched step follows
        assert request.stream is not None
        t = time.perf_counter()
        logits = None
        if not request.resumed:
            request.resumed = True
            try:  # a prompt sent again whole needs no forward; else its longest saved prefix
                logits = self.engine._restore_end(request.stream, list(request.prompt_ids))
                if logits is None:
                    request.todo = self.engine._resume(request.stream, request.prompt_ids)
                else:
                    request.todo = []
                    token = self._first_token(request, logits)
            except Exception as exc:
                self._fail(request, exc)
                return True
        if logits is None:
            position = len(request.stream.ids)
            chunks = aligned_chunks(position, len(request.todo), self.prefill_chunk, request.cut)
            _, end = next(chunks)
            chunk, request.todo = request.todo[:end], request.todo[end:]
            try:
                logits = self.engine.prefill(request.stream, chunk, cut=request.cut)
                token = NO_TOKEN if request.todo else self._first_token(request, logits)
            except Exception as exc:
                self._fail(request, exc)
                return True
            self.stats.prefill_chunks += 1
        now = time.perf_counter()
        self.stats.longest_chunk_s = max(self.stats.longest_chunk_s, now - t)
        if token != NO_TOKEN:
            request.t_first = now
            cheap = self.engine.backend.cheap_snapshots
            if cheap:  # fed nothing yet: the prompt's end (before a reply of one token ends)
                self.engine._save(request.stream, defer_disk=True, end_logits=logits)
            self._take(request, token, now)
        return True

    def _decode_one(self) -> bool:
        """One decode row for every request that has a token to feed."""
        batch = [r for r in self._running if r.next_token != NO_TOKEN]
        launch = self._launcher(batch) if batch else None
        if self._ahead is not None and (self._ahead[0] != batch or launch is None):
            # The batch changed, or its steps cannot run ahead now: the step launched ahead
            # gives its picks, and this step starts afresh from them.
            self._drain()
            batch = [r for r in self._running if r.next_token != NO_TOKEN]
            launch = self._launcher(batch) if batch else None
        if not batch:
            return False
        if launch is not None:
            self._decode_launched(batch, launch)
            return True
        t = time.perf_counter()
        try:
            tokens = self._next_tokens(batch)
        except Exception as exc:  # refused for the batch: each of its requests is told
            for request in batch:
                self._fail(request, exc)
            return True
        now = time.perf_counter()
        self.stats.steps += 1
        self.stats.longest_step_s = max(self.stats.longest_step_s, now - t)
        for request, token in zip(batch, tokens, strict=True):
            self._take(request, token, now)
        return True

    # ----- steps launched ahead of their tokens ----------------------------------------------
    # While the same requests decode and none prefills, each step is launched before the host
    # waits for the last one's tokens (Backend.launch_step, as Engine.generate does for one
    # stream): the GPU computes step n + 1 while the host streams step n's tokens. The step
    # launched ahead feeds each request its pick on the device, so its token is in the
    # stream's ids before the host has seen it; a request that ends there keeps it in its
    # state, as Engine.generate's does.
    def _launcher(self, batch: list[Request]) -> Callable[..., Any] | None:
        """The backend's `launch_step` where this batch's steps may run ahead: every pick
        made on the device, no prompt being prefilled (a prefill's forward rewrites the
        batch layout a launched step follows), no request waiting for a slot."""
        engine = self.engine
        if not (engine.pipelined_decode and engine.backend.launches_steps) or engine.drafter:
            return None
        if self._waiting or any(r.todo for r in self._running):
            return None
        if not all(r.sampler.on_device or r.sampler.takes_argmax for r in batch):
            return None
        return engine.backend.launch_step

    def _draws(self, batch: list[Request]) -> list[Any]:
        return [draw(r.sampler, r.generated, r.stream) for r in batch]

    def _decode_launched(self, batch: list[Request], launch: Callable[..., Any]) -> None:
        """One step of `batch`, its next launched before its tokens are read."""
        engine = self.engine
        t = time.perf_counter()
        if self._ahead is not None:  # launched last time, fed the tokens taken since
            pending, self._ahead = self._ahead[1], None
        else:
            rows = [(r.stream.slot, len(r.stream.ids)) for r in batch]  # type: ignore[union-attr]
            ids = [r.next_token for r in batch]
            try:
                pending = launch(Batch.step(rows), ids, self._draws(batch))
            except Exception as exc:
                for request in batch:
                    self._fail(request, exc)
                return
            for request in batch:
                request.stream.ids.append(request.next_token)  # type: ignore[union-attr]
        ahead = None
        if all(
            len(r.generated) + 1 < r.params.max_new_tokens and len(r.stream.ids) < engine.context  # type: ignore[union-attr]
            for r in batch
        ):
            try:
                ahead = launch(None, None, self._draws(batch))
            except RequestRefused:  # no memory for it: the step in flight still gives its
                ahead = None  # tokens, and the next step starts afresh from them
        try:
            tokens = pending.tokens()
        except Exception as exc:
            for request in batch:
                self._fail(request, exc)
            return
        now = time.perf_counter()
        self.stats.steps += 1
        self.stats.longest_step_s = max(self.stats.longest_step_s, now - t)
        if ahead is not None:
            for request, token in zip(batch, tokens, strict=True):
                request.stream.ids.append(token)  # type: ignore[union-attr]
            self._ahead = (list(batch), ahead)
        for request, token in zip(batch, tokens, strict=True):
            self._take(request, token, now)

    def _drain(self) -> None:
        """Take the picks of the step launched ahead (its requests were fed them on the
        device): before a prefill's forward, or when the batch changed."""
        if self._ahead is None:
            return
        batch, pending = self._ahead
        self._ahead = None
        try:
            tokens = pending.tokens()
        except Exception as exc:
            for request in batch:
                if request in self._running:
                    self._fail(request, exc)
            return
        now = time.perf_counter()
        self.stats.steps += 1
        for request, token in zip(batch, tokens, strict=True):
            if request in self._running and request.next_token != NO_TOKEN:
                self._take(request, token, now)

    # The two places tokens are picked (a test overrides them to force an output).
    def _first_token(self, request: Request, logits: Any) -> int:
        return request.sampler(logits, request.generated)  # type: ignore[misc]

    def _next_tokens(self, batch: list[Request]) -> list[int]:
        return self.engine._next_tokens(
            [r.stream for r in batch],  # type: ignore[misc]
            [r.next_token for r in batch],
            [r.sampler for r in batch],  # type: ignore[misc]
            [r.generated for r in batch],
        )

    def _take(self, request: Request, token: int, now: float) -> None:
        """A token was picked for `request`: emit it, and end the request or queue the token
        for the next step (the checks and their order are `Engine.generate`'s)."""
        engine, stream = self.engine, request.stream
        assert stream is not None
        if request.last_token_at:
            self.stats.longest_gap_s = max(self.stats.longest_gap_s, now - request.last_token_at)
        request.last_token_at = now
        request.generated.append(token)
        request.next_token = NO_TOKEN
        eos = token in engine.eos_ids and not request.ignore_eos
        reason = None
        if eos:
            reason = "stop"
        elif len(request.generated) >= request.params.max_new_tokens:
            reason = "length"
        elif request.cancelled:
            reason = "cancelled"
        elif len(request.prompt_ids) + len(request.generated) > engine.context:
            reason = "length"  # no room to feed it (a step launched ahead may have)
        if reason is not None:
            self._finish(request, token, reason)
            return
        text = "" if token in engine.eos_ids else request.decoder.push(token)
        assert request.sampler is not None
        self._deliver(request, TokenEvent(token, text, logprobs=request.sampler.last))
        request.next_token = token

    def _finish(self, request: Request, token: int, reason: str) -> None:
        """The final event; the slot goes back (after saving its state for a follow-up)."""
        text = ""
        if token != NO_TOKEN and token not in self.engine.eos_ids:
            text = request.decoder.push(token)
        if request.decoder is not None:
            text += request.decoder.flush()
        stats = None
        if request.t_first:
            n = len(request.generated)
            stats = GenerationStats.measure(
                len(request.prompt_ids), n, request.t0, request.t_first, request.stream
            )
        self.stats.finished += 1  # before the slot goes back: `running` drops last
        self._release(request, save=token != NO_TOKEN)
        request.finish_reason = reason
        last = None  # this token's log-probabilities, where the request asked for them
        if request.sampler is not None and token != NO_TOKEN:
            last = request.sampler.last
        self._deliver(request, TokenEvent(token, text, True, reason, stats, last))
        request.done.set()
        self._ready_when_idle()

    def _fail(self, request: Request, exc: BaseException) -> None:
        self._release(request, save=False)
        request.finish_reason = "error"
        self._deliver(request, exc)
        request.done.set()
        self._ready_when_idle()

    def _ready_when_idle(self) -> None:
        """The host buffers for the next reply's moves, pinned once no stream decodes or
        waits (pinning holds every launch), after the last request's final event."""
        if not self._running and not self._waiting:
            self.engine.prompt_cache.ready_next()

    def _release(self, request: Request, save: bool) -> None:
        stream, request.stream = request.stream, None
        try:
            if stream is not None:
                try:
                    if save:
                        self.engine._save(stream)
                    self.engine.prompt_cache.persist_deferred()
                finally:
                    self.engine._close_stream(stream)
        finally:
            # Last, once the slot is free: a request leaves `running` with its slot.
            if request in self._running:
                self._running.remove(request)

    def _deliver(self, request: Request, item: Any) -> None:
        try:
            request._sink(item)
        except Exception:  # the receiver is gone (a closed event loop): stop serving it
            request.cancel()
