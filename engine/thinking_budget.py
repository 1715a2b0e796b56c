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
from contextlib import closing
from dataclasses import replace
from typing import Any

from engine.constraint import opens_thinking
from engine.request_types import NO_TOKEN, GenerationParams, GenerationStats, TokenEvent
from engine.tokenizer import CloseWatch, StreamDecoder

CLOSE = (
    "\n\nConsidering the limited time by the user, I have to give the solution based on the "
    "thinking directly now.\n</think>\n\n"
)


class _Either:
    """Set once either event is: the user's cancel, or the budget's stop (`set` sets the
    stop: the scheduler's requests cancel themselves through it, as a generator left early
    does)."""

    def __init__(self, cancel: threading.Event | None, stop: threading.Event) -> None:
        self.cancel, self.stop = cancel, stop

    def is_set(self) -> bool:
        return self.stop.is_set() or (self.cancel is not None and self.cancel.is_set())

    def set(self) -> None:
        self.stop.set()


def starts_thinking(engine: Any, prompt_ids: list[int]) -> bool:
    """Whether a reply to `prompt_ids` on `engine` starts inside a thinking block (False on
    an engine whose tokenizer is not here: a remote server's)."""
    tokenizer = getattr(engine, "tokenizer", None)
    return tokenizer is not None and opens_thinking(prompt_ids, tokenizer)


def applies(engine: Any, prompt_ids: list[int], budget: int) -> bool:
    """Whether a `budget` (tokens; 0: none) holds a reply to `prompt_ids` on `engine`: one
    that starts inside a thinking block, on an engine whose tokenizer is here."""
    return budget > 0 and starts_thinking(engine, prompt_ids)


def generate_within(
    engine: Any,
    prompt_ids: list[int],
    params: GenerationParams,
    budget: int,
    cancel: threading.Event | None = None,
    spent: int = 0,
    **more: Any,
) -> Iterator[TokenEvent]:
    """`engine.generate(prompt_ids, params, cancel, **more)`'s events, the reply's thinking
    held to `budget` tokens (the reply starts inside its thinking: `applies`). `spent`: the
    tokens a reply gone on with (Continue) has thought already; at least one more comes."""
    total, budget = budget, max(1, budget - spent)
    stop = threading.Event()
    if budget <= 1:
        stop.set()  # the reply's first token is the budget's last
    generated: list[int] = []
    thinking, thought, close, before = True, 0, CloseWatch(), None
    # A reply gone on with that the token limit cut inside the closing words: the rest of
    # them first (not the model's next token and the whole words again).
    rest = close_rest(engine.tokenizer, prompt_ids) if spent >= total else ""
    first = iter(()) if rest else engine.generate(prompt_ids, params, _Either(cancel, stop), **more)
    try:
        for event in first:
            # Tokens past the budget (a scheduler's engine runs ahead of the stop) are not
            # the reply's: the reply is the same whichever engine runs it.
            over = thinking and thought >= budget
            if event.token_id != NO_TOKEN and not over:
                generated.append(event.token_id)
                if thinking:
                    thinking = not close.feed(event.text)
                    thought += 1
                    if thinking and thought >= budget - 1:
                        stop.set()  # the engine ends the reply at the budget's last token
            if not event.finished:
                if not over:
                    yield event
                continue
            user = cancel is not None and cancel.is_set()
            ours = event.finish_reason == "cancelled" and stop.is_set()  # at the budget
            if user or not (over or ours):
                yield event if not over else replace(event, token_id=NO_TOKEN, text="")
                return
            # The budget's last token (it may have closed the thinking itself): the reply
            # goes on after it.
            if not over:
                yield TokenEvent(event.token_id, event.text, logprobs=event.logprobs)
            if event.stats is not None:
                before = replace(event.stats, new_tokens=len(generated))
            break
    finally:
        if not rest:
            first.close()  # the stream's state saved and its slot free before the rest starts
    said = closing_words(engine.tokenizer, rest or CLOSE) if thinking else []
    said = said[: max(0, params.max_new_tokens - len(generated))]  # the limit holds them too
    close_ids = [token for token, _ in said]
    yield from (TokenEvent(token, text) for token, text in said)
    left = params.max_new_tokens - len(generated) - len(close_ids)
    start = time.perf_counter()
    if left <= 0:
        stats = joined(before, None, len(close_ids), 0.0, total)
        yield TokenEvent(NO_TOKEN, "", True, "length", stats)
        return
    # The penalties go on counting the thinking and the closing words, as in a reply that
    # was not cut.
    rest = replace(params, max_new_tokens=left, earlier=(*params.earlier, *generated, *close_ids))
    # Closed with this generator (by a caller that stops at the final event and drops it),
    # so the engine's stream goes back then, whatever else still holds the engine's reply.
    with closing(engine.generate(prompt_ids + generated + close_ids, rest, cancel, **more)) as tail:
        for event in tail:
            if event.finished:
                after = time.perf_counter() - start
                stats = joined(before, event.stats, len(close_ids), after, total)
                event = replace(event, stats=stats)
            yield event


def close_rest(tokenizer: Any, prompt_ids: list[int]) -> str:
    """The rest of CLOSE where the reply at the end of `prompt_ids` stops inside it (cut by
    the token limit while the closing words were put in), past their blank line; "" else
    (a thinking that ends in a blank line of its own is no start of them)."""
    tail = tokenizer.decode(list(prompt_ids[-64:]), skip_special_tokens=False)
    return rest_of_close(tail, shortest=len(CLOSE) - len(CLOSE.lstrip()) + 1)


def rest_of_close(text: str, shortest: int = 1) -> str:
    """CLOSE past its first n characters where `text` ends with them (shortest <= n, and
    not all of it); "" else."""
    for n in range(len(CLOSE) - 1, shortest - 1, -1):
        if text.endswith(CLOSE[:n]):
            return CLOSE[n:]
    return ""


def closing_words(tokenizer: Any, text: str = CLOSE) -> list[tuple[int, str]]:
    """CLOSE (or the `text` left of it) as tokens put in the reply (not the model's picks):
    each id with its text."""
    decoder, ids = StreamDecoder(tokenizer), tokenizer.encode(text)
    out = [(token, decoder.push(token)) for token in ids]
    if out:
        out[-1] = (out[-1][0], out[-1][1] + decoder.flush())
    return out


def joined(
    before: GenerationStats | None,
    after: GenerationStats | None,
    forced: int,
    seconds: float,
    budget: int = 0,
) -> GenerationStats | None:
    """The whole reply's figures from its two parts' (`forced`: the closing words' tokens;
    `seconds`: the second part's time, its prompt included): the prompt's as the first part
    read it, the decode's rate over every token after the first; `thinking_cut` the
    `budget` where the closing words were put in."""
    if before is None:  # no first part: the closing words' rest went in first
        if after is None or not forced:
            return after
        return replace(after, new_tokens=after.new_tokens + forced, thinking_cut=budget)
    new = before.new_tokens + forced + (after.new_tokens if after is not None else 0)
    first_decode = (before.new_tokens - 1) / before.decode_tok_s if before.decode_tok_s else 0.0
    decode = first_decode + seconds
    return replace(
        before,
        new_tokens=new,
        decode_tok_s=(new - 1) / decode if decode > 0 and new > 1 else before.decode_tok_s,
        drafted=before.drafted + (after.drafted if after is not None else 0),
        drafts_kept=before.drafts_kept + (after.drafts_kept if after is not None else 0),
        thinking_cut=budget if forced else 0,
    )
