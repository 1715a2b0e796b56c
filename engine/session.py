"""The engine's public API: load a model, generate on persistent streams, unload.

    engine = Engine.load(model_dir, EngineSettings.from_env(), context=8192)
    for event in engine.generate(engine.chat_ids(messages), GenerationParams()):
        print(event.text, end="")

Each stream owns a backend state slot. A prompt runs as windows of at most `max_rows` rows
(prefill), then one row per step (decode); `generate_many` steps several streams together in
one batch, and gives each the same tokens it would get alone. `engine.scheduler` serves
requests that come and go (continuous batching) with the same stream primitives.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine import drafting
from engine.backend_choice import select_backend
from engine.backends.base import Backend, Batch
from engine.config import EngineSettings
from engine.constraint import THINK_CLOSE, Constraint, GrammarTokenizer, opens_thinking
from engine.errors import ConfigError, NumericalError, RequestRefused
from engine.load_admission import admit_load
from engine.memory import BASE_ROWS, Decision
from engine.models.qwen35 import Qwen35Model
from engine.prompt_cache import open_prompt_cache
from engine.request_types import NO_TOKEN, GenerationParams, GenerationStats, TokenEvent, id_list
from engine.sampling import Sampler
from engine.steps_ahead import StepsAhead, draw

Progress = Callable[[str, float], None]
PrefillProgress = Callable[[int, int], None]  # the prompt's tokens run so far, of how many
HOST_PROMPT_CACHE_BYTES = 1 << 30  # saved stream states kept in host memory (numpy backend)
UNLOADED = "the model was unloaded; load it again to generate"

log = logging.getLogger(__name__)
__all__ = ["Engine", "GenerationParams", "GenerationStats", "TokenEvent", "aligned_chunks"]


@dataclass
class _Stream:
    slot: int
    ids: list[int] = field(default_factory=list)  # every token now in the slot's state
    drafted: int = 0  # this request's drafts (Drafter counts them), and those kept
    drafts_kept: int = 0
    reused: int = 0  # the prompt's tokens restored from the prompt cache, not prefilled


def aligned_chunks(
    position: int, count: int, rows: int, cut: int | None = None
) -> Iterator[tuple[int, int]]:
    """(start, end) offsets into `count` ids fed from absolute `position`, cut where the
    position reaches a multiple of `rows`, and at absolute position `cut`: the same cuts
    with or without a restored state."""
    start = 0
    while start < count:
        end = min(count, start + rows - (position + start) % rows)
        if cut is not None and position + start < cut < position + end:
            end = cut - position
        yield start, end
        start = end


def check_sizes(context: int | None, streams: int, max_rows: int | None) -> None:
    """Engine.load's sizes: each a whole number of at least 1 (context and max_rows may be
    None: the plan chooses)."""
    for name, value, none_ok in (
        ("context", context, True),
        ("streams", streams, False),
        ("max_rows", max_rows, True),
    ):
        if value is None and none_ok:
            continue
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ConfigError(
                f"Engine.load {name}={value!r}: the {name} must be a whole number of at least "
                f"1{' (or None: the plan chooses)' if none_ok else ''}; raise the {name} setting"
            )


def vocab_rows(tokenizer: Any, config: Any) -> int:
    """Rows of the LM head that are real tokens: the checkpoint pads its vocabulary past the
    tokenizer's, and sampling never picks a padding row."""
    return min(tokenizer.vocab_size, config.vocab_size)


class Engine:
    """A loaded model with its tokenizer, backend state slots and generate loop."""

    # A reply's decode steps go in one ahead of the host on a backend that can launch them
    # without waiting (`launch_step`): the GPU computes token t + 1 while the host streams
    # token t. Off: each step waits for its token (tests compare the two).
    pipelined_decode = True
    drafter: Any = None  # engine.drafting.Drafter where the MTP head drafts (Engine.load)
    drafting = ""  # what the load decided about drafting, or why it is unavailable
    reports_prompt_progress = True  # generate() takes `progress` (callers check this)

    def __init__(
        self,
        model_dir: Path,
        checkpoint: Any,
        tokenizer: Any,
        backend: Backend,
        model: Qwen35Model,
        context: int,
        streams: int,
        max_rows: int,
        decision: Decision | None = None,
    ):
        self.model_dir = model_dir
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.tokenizer = tokenizer
        self.backend = backend
        self.model = model
        self.context = context
        self.streams = streams
        self.max_rows = max_rows
        self.decision = decision
        self._free_slots = list(range(streams))
        self.steps_ahead = StepsAhead(backend)  # a reply's step launched before its token
        self._lock = threading.Lock()
        eos = set(tokenizer.eos_ids) | set(self.config.eos_token_ids)
        self.eos_ids = frozenset(eos)
        self.vocab_rows = vocab_rows(tokenizer, self.config)
        self._im_start = tokenizer.token_to_id("<|im_start|>")
        # The tokenizer as the grammar of a held reply reads it (built on first use).
        self.grammar_tokenizer = GrammarTokenizer(tokenizer, self.vocab_rows, sorted(eos))
        cache_bytes = HOST_PROMPT_CACHE_BYTES
        if decision is not None:  # on the card, or in host memory (one of the two is 0)
            b = decision.breakdown
            cache_bytes = b.prompt_cache + b.prompt_cache_on_host
        self.prompt_cache = open_prompt_cache(backend, model_dir, checkpoint.tensors, cache_bytes)

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        settings: EngineSettings | None = None,
        context: int | None = 8192,
        streams: int = 1,
        max_rows: int | None = None,
        progress: Progress | None = None,
        eager: bool | None = None,
    ) -> Engine:
        """Read the checkpoint, plan memory, upload weights and allocate stream state.

        On a GPU the plan is admitted before anything is allocated (DoesNotFit otherwise);
        context None asks for the largest context the card admits. The numpy backend keeps
        the context asked for (8192 when None). `eager` overrides the decision's choice of
        allocating the scratch whole at warm-up (tests use it to force the lazy path).
        max_rows: the most rows a prefill window holds; None lets the plan choose (512, wider
        where the card has memory left over; 512 on the numpy backend)."""
        from engine.checkpoint import Checkpoint
        from engine.tokenizer import Tokenizer

        check_sizes(context, streams, max_rows)
        settings = settings or EngineSettings.from_env()
        report = progress or (lambda _stage, _fraction: None)
        report("reading checkpoint", 0.0)
        model_dir = Path(model_dir)
        checkpoint = Checkpoint.open(model_dir)
        tokenizer = Tokenizer.load(model_dir, eos_token_ids=checkpoint.config.eos_token_ids)
        backend = select_backend(settings, max_rows or BASE_ROWS, checkpoint.config)
        config = checkpoint.config
        if context is not None:
            context = min(context, config.max_position_embeddings)
        decision = None
        if backend.pool is not None:
            report("planning memory", 0.05)
            decision = admit_load(checkpoint, backend, settings, context, streams, max_rows)
            context, streams, max_rows = decision.context, decision.streams, decision.max_rows
        context, max_rows = context or 8192, max_rows or BASE_ROWS
        backend.configure(decision, vocab_rows(tokenizer, config))
        try:
            report("loading weights", 0.1)
            backend.draft_tokens = (draft := drafting.choose(checkpoint, settings, decision)).tokens
            weights = backend.load_weights(checkpoint, config)
            report("allocating stream state", 0.9)
            backend.alloc_state(config, streams, context)
            model = Qwen35Model(config, backend, weights)
            # A first load on this machine compiles the kernels (prebuild.py); later ones
            # read them from the kernel cache, and this passes in a moment.
            backend.finish_compiling(
                lambda done, total: report(
                    f"compiling kernels, {done} of {total}", 0.9 + 0.05 * done / total
                )
            )
            report("warming up", 0.95)
            if eager is None:
                eager = decision is None or decision.eager
            backend.warm_up(model, eager=eager)
            # Collections during a prompt need not traverse the loaded model's objects: full
            # ones over them added 0.02 to 0.3 s at random to an 8K prompt on the H200.
            gc.collect()
            gc.freeze()
            report("ready", 1.0)
            args = (model_dir, checkpoint, tokenizer, backend, model, context, streams)
            return drafting.attach(cls(*args, max_rows, decision), draft)
        except BaseException:  # a failed load holds nothing; its error names what failed
            try:
                backend.release()
            except Exception:
                log.exception("releasing what a failed load allocated")
            raise

    # ----- prompts ------------------------------------------------------------------------
    def chat_ids(
        self, messages: list[dict[str, str]], enable_thinking: bool | None = None
    ) -> list[int]:
        return self.tokenizer.chat_ids(messages, enable_thinking=enable_thinking)

    def held_bytes(self) -> int:
        return self.backend.held_bytes()

    # ----- streams ------------------------------------------------------------------------
    def _open_stream(self) -> _Stream:
        with self._lock:
            if not self._free_slots:
                raise RequestRefused(
                    f"all {self.streams} streams are busy; wait for a reply to finish or "
                    "raise the streams setting and reload"
                )
            slot = self._free_slots.pop(0)
        try:
            self.backend.reset_slot(slot)
        except BaseException:  # the slot goes back: no request holds it
            self._close_stream(_Stream(slot))
            raise
        return _Stream(slot)

    def _close_stream(self, stream: _Stream) -> None:
        with self._lock:
            self._free_slots.append(stream.slot)
            self._free_slots.sort()

    def checked_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """The prompt as a list of ints, refused (RequestRefused) before anything runs where
        it is empty, holds an id outside the vocabulary, or the model was unloaded."""
        if self.backend is None:
            raise RequestRefused(UNLOADED)
        return id_list(prompt_ids, self.vocab_rows)

    def _check_room(self, stream: _Stream, new_rows: int) -> None:
        if len(stream.ids) + new_rows > self.context:
            raise RequestRefused(
                f"the conversation needs {len(stream.ids) + new_rows} tokens but the context "
                f"is {self.context}; raise the context (the load panel's Context, or "
                "--context) or start a new chat"
            )

    def turn_start(self, prompt: list[int]) -> int | None:
        """Where the prompt's last turn begins: its last `<|im_start|>` (a chat prompt's
        assistant header). The next prompt of a chat repeats the conversation before it but
        not always the tokens after (a template renders the reply from its text, without
        the empty think block the generation prompt held), so a prompt's prefill always
        ends a window there, cache or not, and saves the state there."""
        if self._im_start is None or not prompt:
            return None
        hits = np.flatnonzero(np.asarray(prompt) == self._im_start)
        return int(hits[-1]) if hits.size and hits[-1] > 0 else None

    def prefill(
        self,
        stream: _Stream,
        ids: list[int],
        all_logits: bool = False,
        cut: int | None = None,
        cancel: threading.Event | None = None,
        progress: PrefillProgress | None = None,
    ) -> np.ndarray | None:
        """Run `ids` through the stream in windows of at most max_rows; return the last
        logits `[V]` (or `[len(ids), V]` with all_logits). Windows end at absolute positions
        that are multiples of max_rows (the first one after a restored state runs up to the
        next multiple), so a resumed prompt computes what an uninterrupted one does; and at
        `cut` (`turn_start`), where the state is saved. `progress(done, total)` follows each
        window (on the GPU, as it is queued); a `cancel` set between windows returns None,
        the rest of the prompt not run (a long prompt stops as a reply does)."""
        self._check_room(stream, len(ids))
        self.steps_ahead.settle()  # another reply's step in flight: read before this forward
        outputs = []
        for start, end in aligned_chunks(len(stream.ids), len(ids), self.max_rows, cut):
            if start > 0 and cancel is not None and cancel.is_set():
                return None
            chunk = ids[start:end]
            batch = Batch.window(stream.slot, len(stream.ids), len(chunk))
            drafts = self.drafter is not None  # the MTP head follows the prompt
            hidden = {"hidden": True} if drafts else {}
            logits = self.model.forward(batch, np.asarray(chunk), all_logits=all_logits, **hidden)
            stream.ids.extend(chunk)
            if drafts:
                self.drafter.follow(stream, ids[end] if end < len(ids) else None)
            if all_logits or end == len(ids):  # the windows before queue without a wait
                outputs.append(self.backend.to_host(logits))
            if len(stream.ids) == cut and self.backend.cheap_snapshots:
                self._save(stream, defer_disk=True)
            if progress is not None:
                progress(end, len(ids))
        out = np.concatenate(outputs) if all_logits else outputs[-1][-1]
        out = out.astype(np.float32)
        # NaN/Inf logits: refused by name, not sampled as token 0 (one row checked: cheap).
        last = out[-1] if all_logits else out
        if not np.isfinite(last).all():
            bad = int(last.size - np.isfinite(last).sum())
            raise NumericalError(
                f"the model produced NaN/Inf logits ({bad} of {last.size} for the prompt's last "
                f"token); check the checkpoint's weights in {self.model_dir} for NaN or "
                "infinite values, or run with SNUG_COMPUTE_DTYPE=float32 if float16 overflows"
            )
        return out

    def step(self, streams: list[_Stream], ids: list[int]) -> np.ndarray:
        """One decode row for each stream; returns logits `[len(streams), V]`."""
        logits, _ = self._step_device(streams, ids)
        return self.backend.to_host(logits).astype(np.float32)

    def _step_device(self, streams: list[_Stream], ids: list[int]) -> tuple[Any, Any]:
        """One decode row per stream: (logits, device greedy tokens or None) as the backend
        holds them. On the GPU this replays the captured decode graph."""
        for s in streams:
            self._check_room(s, 1)
        self.steps_ahead.settle()
        batch = Batch.step([(s.slot, len(s.ids)) for s in streams])
        logits, greedy = self.backend.decode_step(self.model, batch, np.asarray(ids))
        for s, token in zip(streams, ids, strict=True):
            s.ids.append(token)
        return logits, greedy

    def _next_tokens(
        self,
        streams: list[_Stream],
        ids: list[int],
        samplers: list[Sampler],
        outputs: list[list[int]],
        draft: bool = True,
    ) -> list[int]:
        """Decode one step and pick each stream's next token. Greedy requests without a
        presence penalty take the device's argmax, and what the device sampler does (top-k,
        top-p, presence penalty; not min-p) draws there: 4 bytes come back, not the logits.
        One stream with a drafter (and `draft`): its drafting round instead."""
        if draft and self.drafter is not None and len(streams) == 1 and not samplers[0].host_only:
            return [self.drafter.next_token(streams[0], ids[0], samplers[0], outputs[0])]
        if self.drafter is not None:
            # A stream a verify gave several tokens has fed them already: they are handed
            # out before it decodes with others (a request that joined its batch).
            queued = [self.drafter.queued(s) for s in streams]
            if any(q is not None for q in queued):
                rest = [i for i, q in enumerate(queued) if q is None]
                if rest:
                    parts = ([x[i] for i in rest] for x in (streams, ids, samplers, outputs))
                    picks = self._next_tokens(*parts, draft=False)
                    for i, token in zip(rest, picks, strict=True):
                        queued[i] = token
                return queued  # type: ignore[return-value]
        logits, greedy = self._step_device(streams, ids)
        plain = [s.takes_argmax for s in samplers]
        if greedy is not None and all(plain):
            return [int(t) for t in greedy.get()]
        drawn = [p or s.on_device for p, s in zip(plain, samplers, strict=True)]
        picks: list[int | None] = [None] * len(samplers)
        if greedy is not None and self.backend.samples_on_device and any(drawn):
            # Top-k / top-p draws on the device too: 4 bytes per row come back, not the
            # logits (a 248K vocabulary costs milliseconds on the host). Each row's draw is
            # the one it gets alone, beside rows picked on the host or not.
            rows = [
                draw(s, out, st) if d else None
                for s, out, st, d in zip(samplers, outputs, streams, drawn, strict=True)
            ]
            got = self.backend.sample_rows(logits, greedy, rows).get()
            picks = [int(t) if d else None for t, d in zip(got, drawn, strict=True)]
            if all(drawn):
                return picks  # type: ignore[return-value]
        host = np.asarray(self.backend.to_host(logits), dtype=np.float32)
        return [
            sampler(row, out) if pick is None else pick
            for sampler, row, out, pick in zip(samplers, host, outputs, picks, strict=True)
        ]

    # ----- generation ---------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: list[int],
        params: GenerationParams | None = None,
        cancel: threading.Event | None = None,
        progress: PrefillProgress | None = None,
    ) -> Iterator[TokenEvent]:
        """Stream tokens for one prompt. Ends on an end-of-sequence id, max_new_tokens or
        `cancel` (also while the prompt runs: then the one event is the final one, no token,
        NO_TOKEN); the final event carries the stats. `progress(done, total)`: the prompt's
        tokens run so far, of those it needs (`prefill`)."""
        from engine.tokenizer import StreamDecoder

        params = GenerationParams.checked(params)
        prompt_ids = self.checked_prompt(prompt_ids)
        sampler = self._sampler(params, prompt_ids)
        decoder = StreamDecoder(self.tokenizer)
        stream = self._open_stream()
        completed = False
        try:
            t0 = time.perf_counter()
            logits = self._restore_end(stream, prompt_ids)
            if logits is None:
                todo = self._resume(stream, prompt_ids)
                cut = self.turn_start(prompt_ids)
                logits = self.prefill(stream, todo, cut=cut, cancel=cancel, progress=progress)
            if logits is None:  # stopped while the prompt ran
                stats = GenerationStats.measure(len(prompt_ids), 0, t0, time.perf_counter(), stream)
                yield TokenEvent(NO_TOKEN, "", True, "cancelled", stats)
                return
            prompt_logits = logits
            generated: list[int] = []
            token = sampler(logits, generated)
            t_first = time.perf_counter()
            reason = None
            launch, me = self._launcher(sampler), object()  # `me`: this reply's steps
            pending = None  # a launched step that reads `token`; its pick is the next one
            while True:
                generated.append(token)
                if token in self.eos_ids:
                    reason = "stop"
                elif len(generated) >= params.max_new_tokens:
                    reason = "length"
                elif cancel is not None and cancel.is_set():
                    reason = "cancelled"
                elif len(prompt_ids) + len(generated) > self.context:  # no room to feed it
                    reason = "length"
                text = "" if token in self.eos_ids else decoder.push(token)
                if reason is not None:
                    text += decoder.flush()
                    stats = GenerationStats.measure(
                        len(prompt_ids), len(generated), t0, t_first, stream
                    )
                    completed = True
                    yield TokenEvent(token, text, True, reason, stats, sampler.last)
                    return
                yield TokenEvent(token, text, logprobs=sampler.last)
                if self.backend is None:  # unloaded while the caller held the reply
                    raise RequestRefused(UNLOADED)
                if len(generated) == 1 and self.backend.cheap_snapshots:
                    # The state is the prompt's, fed nothing yet. Its disk copy (a copy to
                    # the host) waits for the reply's end, off the decode's path.
                    self._save(stream, defer_disk=True, end_logits=prompt_logits)
                if launch is None:
                    token = self._next_tokens([stream], [token], [sampler], [generated])[0]
                    continue
                if pending is None:
                    self._check_room(stream, 1)
                    batch = Batch.step([(stream.slot, len(stream.ids))])
                    pending = launch(me, batch, [token], [draw(sampler, generated, stream)])
                    stream.ids.append(token)
                # The step after it goes in before the host waits for its token, unless the
                # reply ends there anyway, or another forward ran since (this reply's next
                # step then starts afresh); a stop seen now leaves that token in the state
                # (and in stream.ids), as if the stream had been fed it.
                ahead = None
                room = len(stream.ids) < self.context and self.steps_ahead.follows(me)
                if len(generated) + 1 < params.max_new_tokens and room:
                    ahead = launch(me, None, None, [draw(sampler, generated, stream)])
                token = pending.tokens()[0]
                if ahead is not None:
                    stream.ids.append(token)
                pending = ahead
        finally:
            try:
                if self.backend is not None:  # (an unloaded model keeps nothing)
                    if completed:
                        self._save(stream)
                    self.prompt_cache.persist_deferred()
                    self.prompt_cache.ready_next()
            finally:  # the slot goes back whatever a save raised (as the scheduler's do)
                self._close_stream(stream)

    def _sampler(self, params: GenerationParams, prompt_ids: Sequence[int]) -> Sampler:
        """A request's sampler; held to `params.grammar` where it has one."""
        constraint = None
        if params.grammar is not None:
            tok = self.tokenizer
            think_end = tok.token_to_id(THINK_CLOSE) if opens_thinking(prompt_ids, tok) else None
            llt = self.grammar_tokenizer.get()
            constraint = Constraint(params.grammar, llt, self.eos_ids, think_end)
        return Sampler(params.sampling(), self.vocab_rows, constraint, params.logprobs)

    def _launcher(self, sampler: Sampler) -> Callable[..., Any] | None:
        """`StepsAhead.launch` (the backend's `launch_step`, for one reply) where this
        request's steps can run without the host waiting for each token (their picks made on
        the device, each step taking its input from the last one's: `launches_steps`), else
        None."""
        if not (self.pipelined_decode and self.backend.launches_steps) or self.drafter:
            return None
        if not (sampler.on_device or sampler.takes_argmax):
            return None
        return self.steps_ahead.launch

    def _restore_end(self, stream: _Stream, prompt_ids: list[int]) -> np.ndarray | None:
        """A prompt sent again whole (Regenerate, `n` replies, a retry): its state saved at
        its end, restored into the stream, and its last token's logits; None where the
        prompt cache no longer keeps both, or a drafter follows the prompt (its head needs
        the prompt's last hidden row, which is not kept)."""
        if self.drafter is not None:
            return None
        logits = self.prompt_cache.restore_end(stream.slot, prompt_ids)
        if logits is not None:
            stream.ids = list(prompt_ids)
            stream.reused = len(prompt_ids)
        return logits

    def _resume(self, stream: _Stream, prompt_ids: list[int]) -> list[int]:
        """Restore the longest saved state that the prompt extends, from whichever tier of
        the prompt cache has it; return the ids left to prefill."""
        stream.ids = list(self.prompt_cache.restore(stream.slot, prompt_ids))
        stream.reused = len(stream.ids)
        return prompt_ids[len(stream.ids) :]

    def _save(
        self, stream: _Stream, defer_disk: bool = False, end_logits: np.ndarray | None = None
    ) -> None:
        """Keep the stream's state (the prompt's end, with its last logits; a reply's end)
        for a later prompt."""
        self.prompt_cache.save(stream.slot, stream.ids, defer_disk, end_logits)

    def generate_many(
        self, prompts: list[list[int]], params: GenerationParams | None = None
    ) -> list[list[int]]:
        """Serve several prompts concurrently (one decode batch); return each one's tokens
        (each reply ends as `generate` ends it: at an end-of-sequence id, max_new_tokens, or
        where the context is full)."""
        params = GenerationParams.checked(params)
        prompts = [self.checked_prompt(ids) for ids in prompts]
        streams: list[_Stream] = []
        try:
            for _ in prompts:  # those opened before one is refused are closed below
                streams.append(self._open_stream())
            samplers = [self._sampler(params, ids) for ids in prompts]
            outputs: list[list[int]] = [[] for _ in prompts]
            next_ids = []
            for s, ids, sampler, out in zip(streams, prompts, samplers, outputs, strict=True):
                logits = self.prefill(s, ids, cut=self.turn_start(ids))
                next_ids.append(sampler(logits, out))
            active = list(range(len(prompts)))
            while active:
                still = []
                for i in active:
                    outputs[i].append(next_ids[i])
                    done = next_ids[i] in self.eos_ids
                    room = len(prompts[i]) + len(outputs[i]) <= self.context  # to feed it
                    if not done and room and len(outputs[i]) < params.max_new_tokens:
                        still.append(i)
                active = still
                if not active:
                    break
                picked = self._next_tokens(
                    [streams[i] for i in active],
                    [next_ids[i] for i in active],
                    [samplers[i] for i in active],
                    [outputs[i] for i in active],
                )
                for i, token in zip(active, picked, strict=True):
                    next_ids[i] = token
            return outputs
        finally:
            for s in streams:
                self._close_stream(s)

    def unload(self) -> None:
        """Release weights and state (the prompt cache's disk writes are finished first);
        the engine cannot be used afterwards (its requests are refused, and so is the next
        read of a reply still held). Again: nothing."""
        if self.backend is None:
            return
        self.steps_ahead.settle()  # a held reply's step in flight ends before its memory goes
        self.prompt_cache.close()
        self.backend.release()
        self.model = None  # type: ignore[assignment]
        self.backend = None  # type: ignore[assignment]
        gc.unfreeze()  # what load froze, collectable again (cycles among it included)
