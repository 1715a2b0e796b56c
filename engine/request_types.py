"""A request and what it streams back: the parameters of one reply (GenerationParams), each
token as it comes (TokenEvent), and the reply's figures on the last one (GenerationStats).
`Engine.generate` and the scheduler take and give these; engine.session names them too."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from engine.errors import RequestRefused, SettingOutOfRange, quoted
from engine.sampling import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprobs, whole_number

NO_TOKEN = -1  # the token id of a final event that carries no token (cancelled, stopped)


@dataclass(frozen=True)
class GenerationParams(SamplingParams):
    """One request: how many tokens at most, and how to sample them (SamplingParams)."""

    max_new_tokens: int = 1024
    # The reply's text held to this grammar (engine.constraint.json_grammar), or None.
    grammar: str | None = None
    # Each token's log-probability and this many of the likeliest alternatives' (0 to
    # MAX_TOP_LOGPROBS) on its event, or None: not asked (sampling.token_logprobs).
    logprobs: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.max_new_tokens
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
            raise SettingOutOfRange(
                f"max_new_tokens {quoted(n)} must be a whole number of at least 1 (the most "
                "tokens the reply may have)"
            )
        if self.logprobs is not None:
            top = whole_number(
                "logprobs", self.logprobs, f" from 0 to {MAX_TOP_LOGPROBS} (or None)"
            )
            if top > MAX_TOP_LOGPROBS:
                raise SettingOutOfRange(
                    f"logprobs {top}: at most {MAX_TOP_LOGPROBS} alternatives a token"
                )
            object.__setattr__(self, "logprobs", top)
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise SettingOutOfRange(
                f"grammar {quoted(self.grammar, 80)} must be a grammar's text (a str), or None"
            )

    @classmethod
    def checked(cls, params: Any) -> GenerationParams:
        """A request's params: GenerationParams() for None; RequestRefused, naming what
        came, for anything but a GenerationParams (before a stream is taken)."""
        if params is None:
            return cls()
        if not isinstance(params, cls):
            raise RequestRefused(
                f"params must be a GenerationParams (engine.request_types), not "
                f"{type(params).__name__} {quoted(params, 80)}; make one with its settings as "
                "keywords: GenerationParams(max_new_tokens=..., temperature=...)"
            )
        return params

    def sampling(self) -> SamplingParams:
        return SamplingParams(**{f.name: getattr(self, f.name) for f in fields(SamplingParams)})


def id_list(prompt_ids: Any, vocab_rows: int) -> list[int]:
    """The prompt's token ids as a list of ints, checked before anything runs: any sequence
    of ints (a list, a tuple, a numpy integer array), not empty, each id in
    [0, vocab_rows). RequestRefused names the first id at fault and its position."""
    try:
        ids = np.asarray(prompt_ids)
    except (TypeError, ValueError, OverflowError):  # ragged, or not a sequence at all
        ids = np.asarray(None)
    if ids.ndim != 1:
        raise RequestRefused(
            f"the prompt must be a sequence of token ids (ints), not {quoted(prompt_ids, 80)}"
        )
    if ids.size == 0:
        raise RequestRefused("the prompt is empty; type a message first")
    ints = ids.dtype.kind in "iu"
    if ints:
        bad = (ids < 0) | (ids >= vocab_rows)
    else:  # floats, bools, strings, ints past 64 bits: read one by one
        bad = np.array([not _is_int(t) or not 0 <= t < vocab_rows for t in prompt_ids])
    if np.any(bad):
        i = int(np.argmax(bad))
        token = int(ids[i]) if ints else prompt_ids[i]
        what = f"is outside the model's vocabulary [0, {vocab_rows})"
        if not _is_int(token):
            what = f"is not an integer (the ids are whole numbers in [0, {vocab_rows}))"
        raise RequestRefused(
            f"the prompt's token id {quoted(token, 80)} at position {i} {what}; send ids that "
            "this model's tokenizer gives"
        )
    return ids.tolist() if ints else [int(t) for t in prompt_ids]


def _is_int(token: Any) -> bool:
    return isinstance(token, int | np.integer) and not isinstance(token, bool)


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int
    new_tokens: int
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    drafted: int = 0  # tokens the MTP head drafted for this reply (engine/drafting.py)
    drafts_kept: int = 0  # of those, the ones the model's verify kept
    cached_tokens: int = 0  # of the prompt's, restored from the prompt cache (not prefilled)
    # The budget its thinking was closed at (engine/thinking_budget.py); 0: not closed so.
    thinking_cut: int = 0

    @classmethod
    def measure(
        cls, prompt_tokens: int, new_tokens: int, t0: float, t_first: float, stream: Any = None
    ) -> GenerationStats:
        """A reply's figures now: started at `t0`, its first token at `t_first`
        (`time.perf_counter`); `stream` (engine.session's) counts its drafts and the prompt's
        tokens restored from the prompt cache."""
        now = time.perf_counter()
        prefill_s, decode_s = max(t_first - t0, 1e-9), max(now - t_first, 1e-9)
        return cls(
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            ttft_s=t_first - t0,
            prefill_tok_s=prompt_tokens / prefill_s,
            decode_tok_s=(new_tokens - 1) / decode_s if new_tokens > 1 else 0.0,
            drafted=getattr(stream, "drafted", 0),
            drafts_kept=getattr(stream, "drafts_kept", 0),
            cached_tokens=getattr(stream, "reused", 0),
        )


@dataclass(frozen=True)
class TokenEvent:
    """One generated token; `stats` is set on the final event (`finished=True`)."""

    token_id: int
    text: str
    finished: bool = False
    finish_reason: str | None = None
    stats: GenerationStats | None = None
    logprobs: TokenLogprobs | None = None  # where the request asked (GenerationParams)


def progress_args(engine: object, progress: object) -> dict[str, object]:
    """`generate`'s keyword for the prompt's progress, for an engine that takes it
    (`Engine.reports_prompt_progress`); none for another (a remote server, a stand-in)."""
    return {"progress": progress} if getattr(engine, "reports_prompt_progress", False) else {}
