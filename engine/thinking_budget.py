"""A reply's thinking held to a budget of tokens.

Qwen3.5 may think for thousands of tokens before it answers; on a small card, at tens of
tokens a second, that is minutes before the first word of the answer. With a budget, a
reply still thinking after that many tokens is stopped there and goes on from its thinking
with the words Qwen's model card gives for an early stop (CLOSE: the thinking cut short,
then `</think>`), so the answer follows at once. The stop is an ordinary end of a reply:
its state is saved (engine/prompt_cache.py), so the reply goes on from it reading only
the closing words, not the prompt and the thinking again, where the prompt cache holds it.

The consumer sees one reply: the thinking, the closing words (an event a token, as the
model's are), the answer; its last event carries the whole reply's figures. A reply that
closes its thinking within the budget is not touched. Engine.generate's own loop does not
know of budgets: this wraps it, for the app's worker and the command line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from engine.constraint import opens_thinking
from engine.request_types import NO_TOKEN, GenerationParams, GenerationStats, TokenEvent
from engine.tokenizer import THINK_CLOSE, StreamDecoder

CLOSE = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the "
    "thinking directly now.\n</think>\n\n"
)


class _Either:
    """Set once either event is: the user's cancel, or the budget's stop."""

    def __init__(self, *events: threading.Event | None) -> None:
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


def applies(engine: Any, prompt_ids: list[int], budget: int) -> bool:
    """Whether a `budget` (tokens; 0: none) holds a reply to `prompt_ids` on `engine`: one
    that starts inside a thinking block, on an engine whose tokenizer is here."""
    tokenizer = getattr(engine, "tokenizer", None)
    return budget > 0 and tokenizer is not None and opens_thinking(prompt_ids, tokenizer)


def generate_within(
    engine: Any,
    prompt_ids: list[int],
    params: GenerationParams,
    budget: int,
    cancel: threading.Event | None = None,
    **more: Any,
) -> Iterator[TokenEvent]:
    """`engine.generate(prompt_ids, params, cancel, **more)`'s events, the reply's thinking
    held to `budget` tokens (the reply starts inside its thinking: `applies`)."""
    stop = threading.Event()
    generated: list[int] = []
    thinking, thought, tail = True, 0, ""
    first = engine.generate(prompt_ids, params, _Either(cancel, stop), **more)
    try:
        for event in first:
            if event.token_id != NO_TOKEN:
                generated.append(event.token_id)
            if thinking:
                tail = (tail + event.text)[-(len(THINK_CLOSE) + len(event.text)) :]
                thinking = THINK_CLOSE not in tail
                thought += event.token_id != NO_TOKEN
                if thinking and thought >= budget:
                    stop.set()  # the reply ends at its next token
            cut = event.finish_reason == "cancelled" and stop.is_set()
            if not event.finished or not cut or (cancel is not None and cancel.is_set()):
                yield event
                if event.finished:
                    return
                continue
            # Stopped by the budget: its last token is the thinking's, the reply goes on.
            yield TokenEvent(event.token_id, event.text, logprobs=event.logprobs)
            before = event.stats
            break
        else:
            return
    finally:
        first.close()  # the stream's state saved and its slot free before the rest starts
    close_ids = engine.tokenizer.encode(CLOSE) if thinking else []
    yield from _said(engine.tokenizer, close_ids)
    left = params.max_new_tokens - len(generated) - len(close_ids)
    start = time.perf_counter()
    if left <= 0:
        stats = _joined(before, None, len(close_ids), 0.0)
        yield TokenEvent(NO_TOKEN, "", True, "length", stats)
        return
    rest = replace(params, max_new_tokens=left)
    for event in engine.generate(prompt_ids + generated + close_ids, rest, cancel, **more):
        if event.finished:
            after = time.perf_counter() - start
            event = replace(event, stats=_joined(before, event.stats, len(close_ids), after))
        yield event


def _said(tokenizer: Any, ids: list[int]) -> Iterator[TokenEvent]:
    """An event for each of `ids`, tokens put in the reply (not the model's picks)."""
    decoder = StreamDecoder(tokenizer)
    for n, token in enumerate(ids, 1):
        text = decoder.push(token) + (decoder.flush() if n == len(ids) else "")
        yield TokenEvent(token, text)


def _joined(
    before: GenerationStats | None, after: GenerationStats | None, forced: int, seconds: float
) -> GenerationStats | None:
    """The whole reply's figures from its two parts' (`forced`: the closing words' tokens;
    `seconds`: the second part's time, its prompt included): the prompt's as the first part
    read it, the decode's rate over every token after the first."""
    if before is None:
        return after
    new = before.new_tokens + forced + (after.new_tokens if after is not None else 0)
    first_decode = (before.new_tokens - 1) / before.decode_tok_s if before.decode_tok_s else 0.0
    decode = first_decode + seconds
    return replace(
        before,
        new_tokens=new,
        decode_tok_s=(new - 1) / decode if decode > 0 and new > 1 else before.decode_tok_s,
        drafted=before.drafted + (after.drafted if after is not None else 0),
        drafts_kept=before.drafts_kept + (after.drafts_kept if after is not None else 0),
    )
