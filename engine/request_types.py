"""A request and what it streams back: the parameters of one reply (GenerationParams), each
token as it comes (TokenEvent), and the reply's figures on the last one (GenerationStats).
`Engine.generate` and the scheduler take and give these; engine.session names them too."""

from __future__ import annotations

from dataclasses import dataclass, fields

from engine.errors import SnugError
from engine.sampling import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprobs

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
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise SnugError(
                f"logprobs {self.logprobs}: at most {MAX_TOP_LOGPROBS} alternatives a token"
            )

    def sampling(self) -> SamplingParams:
        return SamplingParams(**{f.name: getattr(self, f.name) for f in fields(SamplingParams)})


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
