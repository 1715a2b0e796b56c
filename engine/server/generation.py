"""One request's generation as the HTTP side sees it: the scheduler's events, delivered from
the engine thread into the event loop, cut at stop strings and split into pieces.

The request is cancelled whenever the consumer stops early: a stop string found, the client
gone (the streaming response is cancelled, or `disconnected()` says so), an error. The
scheduler then frees its slot within one step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

from engine.request_types import TokenEvent
from engine.scheduler import NO_TOKEN, Request, Scheduler
from engine.server.reply import Piece, ReplySplitter, StopFilter
from engine.session import GenerationParams, GenerationStats
from engine.thinking_budget import closing_words, joined
from engine.tokenizer import CloseWatch, StreamDecoder

FINISH = {"stop": "stop", "length": "length"}  # engine reason -> API reason ("cancelled": stop)
DISCONNECT_POLL_S = 0.25
PARTS = ("call_start", "call_args")  # a call's pieces while it is written


class Generation:
    """Submit on construction (QueueFull / RequestRefused raise here, before any response
    is sent); iterate `pieces()` once."""

    def __init__(
        self,
        scheduler: Scheduler,
        prompt_ids: list[int],
        params: GenerationParams,
        stops: tuple[str, ...],
        splitter: ReplySplitter | None = None,
        ignore_eos: bool = False,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
        thinking_budget: int = 0,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.scheduler, self.params, self._ignore_eos = scheduler, params, ignore_eos
        self._prompt = list(prompt_ids)
        self._ids: list[int] = []  # the reply's tokens (the closing words' among them)
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.stop = StopFilter(stops)
        self.splitter = splitter
        self.disconnected = disconnected
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        # The reply's tokens up to the one that closes its thinking (where it starts inside
        # a `<think>` block), and the text since the last of them, to find the close in.
        self.reasoning_tokens = 0
        self._thinking = splitter is not None and splitter.mode == "reasoning"
        self._close = CloseWatch()
        self.finish_reason = "stop"
        self.stats: GenerationStats | None = None  # the engine's, with the reply's last event
        # (token id, TokenLogprobs) of the reply's tokens not yet handed out (`take_logprobs`);
        # an end-of-sequence token is not the reply's (unless `ignore_eos`).
        self.wants_logprobs = params.logprobs is not None
        self._logprobs: list[tuple[int, Any]] = []
        self._ends = frozenset() if ignore_eos else frozenset(scheduler.engine.eos_ids)
        # A budget for the thinking (engine/thinking_budget.py): past it, the request is
        # cancelled and a second one goes on from the thinking and the closing words.
        self._budget = thinking_budget if self._thinking else 0
        self._decoder = StreamDecoder(self.scheduler.engine.tokenizer) if self._budget else None
        self._cut = False  # the first request was cancelled at the budget
        self._first: GenerationStats | None = None  # its figures, once it has ended
        self._second_at = 0.0  # when the second request was submitted (0: none)
        self._said = 0  # the closing words' tokens
        self.request: Request = scheduler.submit(
            prompt_ids, params, sink=self._sink, ignore_eos=ignore_eos
        )

    def _sink(self, item: Any) -> None:  # the engine thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def take_logprobs(self) -> list[tuple[int, Any]]:
        """The log-probabilities of the tokens received since the last call, in order."""
        out, self._logprobs = self._logprobs, []
        return out

    def cancel(self) -> None:
        self.request.cancel()

    def abort(self, exc: Exception) -> None:
        """End the reply with `exc` (any thread): `pieces()` gives the tokens that came
        before it, then raises it; the request is cancelled, its slot freed within a step."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, exc)  # before the final event
        self.request.cancel()

    @property
    def usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids, as submitted (before any thinking budget's second part)."""
        return list(self._prompt)

    @property
    def reply_ids(self) -> list[int]:
        """The reply's token ids so far (the closing words of a thinking budget among them)."""
        return list(self._ids)

    @property
    def cached_tokens(self) -> int:
        """The prompt's tokens the engine restored from its prompt cache rather than read
        again (known once the reply has ended)."""
        return self.stats.cached_tokens if self.stats is not None else 0

    def _count_thinking(self, text: str) -> None:
        """Count a token of the reply as reasoning while its thinking is open (the token
        that closes it too)."""
        if not self._thinking:
            return
        self.reasoning_tokens += 1
        self._thinking = not self._close.feed(text)

    @property
    def timings(self) -> dict[str, float] | None:
        """The reply's timings as llama.cpp's server reports them beside the OpenAI fields
        (clients written for it read tokens/s there): the prompt up to the first token (its
        tokens restored from the prompt cache as `cache_n`, those read as `prompt_n`), the
        decode after it, and where the MTP head drafted, its drafts and those kept. None
        until the reply's last event has come."""
        s = self.stats
        if s is None:
            return None
        decode_ms = (s.new_tokens - 1) / s.decode_tok_s * 1e3 if s.decode_tok_s else 0.0
        read = s.prompt_tokens - s.cached_tokens  # prompt_n: the tokens read, not restored
        out = {
            "cache_n": s.cached_tokens,
            "prompt_n": read,
            "prompt_ms": s.ttft_s * 1e3,
            "prompt_per_token_ms": s.ttft_s * 1e3 / max(read, 1),
            "prompt_per_second": read / s.ttft_s if s.ttft_s > 0 else 0.0,
            "predicted_n": s.new_tokens,
            "predicted_ms": decode_ms,
            "predicted_per_token_ms": 1e3 / s.decode_tok_s if s.decode_tok_s else 0.0,
            "predicted_per_second": s.decode_tok_s,
        }
        if s.drafted:
            out |= {"draft_n": s.drafted, "draft_n_accepted": s.drafts_kept}
        return out

    async def pieces(self, call_parts: bool = False) -> AsyncIterator[Piece]:
        """The reply's pieces as they become certain; raises the request's error if any.
        `call_parts`: a call's "call_start" and "call_args" pieces too, for a stream that
        sends a call as it is written (each call ends with its whole "tool_call" either way)."""
        try:
            async for text, final in self._texts():
                kept = self.stop.feed(text)
                if self.stop.hit or final:
                    kept += "" if self.stop.hit else self.stop.flush()
                one_call = False
                for piece in self._split(kept, end=self.stop.hit or final):
                    if piece.kind in PARTS and not call_parts:
                        continue
                    yield piece
                    one_call = piece.kind == "tool_call" and self.splitter.one_call  # type: ignore[union-attr]
                    if one_call:
                        break  # the client takes one call: the rest is not decoded
                if self.stop.hit or one_call:
                    self.finish_reason = "stop"
                    break
            if self.splitter is not None and self.splitter.calls and self.finish_reason == "stop":
                self.finish_reason = "tool_calls"
        finally:
            self.cancel()  # no-op once the request has ended

    def _split(self, text: str, end: bool) -> list[Piece]:
        if self.splitter is None:
            return [Piece("content", text)] if text else []
        pieces = self.splitter.feed(text) if text else []
        return pieces + self.splitter.finish() if end else pieces

    async def _texts(self) -> AsyncIterator[tuple[str, bool]]:
        last_poll = time.monotonic()
        while True:
            if self.disconnected is not None:
                try:
                    item = await asyncio.wait_for(self.queue.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    item = None
                if time.monotonic() - last_poll >= DISCONNECT_POLL_S:
                    last_poll = time.monotonic()
                    if await self.disconnected():
                        self.finish_reason = "cancelled"
                        return
                if item is None:
                    continue
            else:
                item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            past = self._past_budget()  # the first request's tokens after the budget
            if self._decoder is not None and not past:
                item = replace(item, text=self._read(item))
            if item.token_id != NO_TOKEN and not past:
                self._count_token(item.token_id, item.text)
                if self._cut and self._decoder is not None:  # the budget's last token
                    item = replace(item, text=item.text + self._decoder.flush())
                    self._decoder = None
                if item.logprobs is not None and item.token_id not in self._ends:
                    self._logprobs.append((item.token_id, item.logprobs))
            if past and not item.finished:
                continue  # not the reply's: it is the same whenever the cancel lands
            if past:
                for text in self._go_on(item.stats):
                    yield text, False
                if self._second_at:
                    continue
                item = TokenEvent(NO_TOKEN, "", True, "length", None)  # no room left
            if item.finished:
                self.finish_reason = FINISH.get(item.finish_reason, "stop")
                self.stats = item.stats
                if self._first is not None:
                    took = time.perf_counter() - self._second_at if self._second_at else 0.0
                    self.stats = joined(self._first, item.stats, self._said, took, self._budget)
            yield item.text, item.finished
            if item.finished:
                return

    def _read(self, item: Any) -> str:
        """The first request's text of `item`, read here as the scheduler reads it (the same
        text), so that the budget's last token ends the part with what its unfinished
        character shows, as the engine's path ends it (engine/thinking_budget.py)."""
        token, decoder = item.token_id, self._decoder
        text = ""
        if token != NO_TOKEN and token not in self.scheduler.engine.eos_ids:
            text = decoder.push(token)  # type: ignore[union-attr]
        return text + (decoder.flush() if item.finished else "")  # type: ignore[union-attr]

    def _count_token(self, token: int, text: str) -> None:
        self.completion_tokens += 1
        self._ids.append(token)
        self._count_thinking(text)
        budget = self._budget and not self._cut and self._thinking
        if budget and self.reasoning_tokens >= self._budget:
            self._cut = True  # its last token has come
            self.request.cancel()

    def _past_budget(self) -> bool:
        """Whether the first request has given the budget's tokens, so that what else it
        gives (tokens the engine ran ahead with, its final event) is not the reply's."""
        return self._cut and self._first is None

    def _go_on(self, stats: GenerationStats | None) -> list[str]:
        """The closing words (engine/thinking_budget.py), counted as the reply's tokens; then
        the second request, from the prompt, the thinking and those words, for what the
        reply has left (none left: no second request, and the reply ends at its limit)."""
        self._first = stats or GenerationStats(len(self._prompt), len(self._ids), 0.0, 0.0, 0.0)
        # Its last token may have closed the thinking itself: then no words are put in.
        said = closing_words(self.scheduler.engine.tokenizer) if self._thinking else []
        said = said[: max(0, self.params.max_new_tokens - len(self._ids))]  # within the limit
        for token, text in said:
            self._count_token(token, text)
        self._said = len(said)
        left = self.params.max_new_tokens - len(self._ids)
        if left > 0:
            # The penalties go on counting the thinking, as in a reply not cut.
            earlier = (*self.params.earlier, *self._ids)
            params = replace(self.params, max_new_tokens=left, earlier=earlier)
            self.request = self.scheduler.submit(
                self._prompt + self._ids, params, sink=self._sink, ignore_eos=self._ignore_eos
            )
            self._second_at = time.perf_counter()
        return [text for _, text in said]
