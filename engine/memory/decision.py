"""The admission decision: a value the engine, the CLI (`snug plan`) and the GUI all show."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

from engine.config import GIB
from engine.memory.speed import Prediction
from engine.memory.workspace import ATTN_QUERY_ROWS


class Verdict(StrEnum):
    FITS = "fits"
    FITS_LAZY = "fits with lazy scratch"
    FITS_HOST_EMBEDDINGS = "fits with host embeddings"
    DOES_NOT_FIT = "does not fit"


@dataclass(frozen=True)
class Breakdown:
    """Bytes, as admission counted them.

    weights: on the card (arena, plus the embedding table unless it is on the host).
    prompt_cache: saved prompt states on the card; prompt_cache_on_host: in pinned host
    memory instead (one of the two is 0).
    scratch_peak / workspace_peak: whole size when eager, growth peak when lazy.
    free_after: what is left of the available bytes after everything and the reserve;
    negative means that much is missing.
    """

    weights: int
    embeddings_on_host: int
    stream_state_each: int
    streams: int
    stream_state_total: int
    prompt_cache: int
    scratch_peak: int
    workspace_peak: int
    reserve: int
    free_after: int
    card_total: int
    card_free: int
    limit: int | None
    held: int
    prompt_cache_on_host: int = 0


@dataclass(frozen=True)
class Decision:
    """What admission decided. `fixes` pairs each suggestion with the settings it changes:
    (setting, value), or (setting, value, setting, value, ...) where one suggestion changes
    several together (the 4-bit build with a shorter context)."""

    verdict: Verdict
    breakdown: Breakdown
    streams: int
    context: int
    max_rows: int
    eager: bool
    host_embeddings: bool
    suggestions: tuple[str, ...]
    reason: str
    fixes: tuple[tuple[str | int | float, ...], ...] = ()
    prompt_cache_on_host: bool = False  # saved prompt states in pinned host memory
    prediction: Prediction | None = None  # the speed it will give, where the card is known
    score_rows: int = ATTN_QUERY_ROWS  # prefill attention query rows the workspace holds
    kv_cache: str = "bf16"  # how the KV cache is stored (EngineSettings.kv_cache)
    # Drafting with the MTP head (engine.memory.draft): the most tokens a step drafts (0:
    # none), and the sentence that says so, or why drafting is unavailable.
    draft_tokens: int = 0
    drafting: str = ""

    @property
    def fits(self) -> bool:
        return self.verdict is not Verdict.DOES_NOT_FIT

    def planned_peak(self, prompt_cache_held: int | None = None) -> int:
        """The most the plan holds in the pool at once: weights, stream states, scratch and
        workspace (whole when eager, growth peak when lazy) and the saved prompt states on
        the card. Those are counted at their budget (what admission reserves: a long chat
        fills it), or at `prompt_cache_held`, what the prompt cache's device tier holds now,
        at most that budget (the cache evicts to stay in it; 0 on the card when the states
        live in host memory). Receipts compare the second with the pool's peak."""
        b = self.breakdown
        cache = b.prompt_cache
        if prompt_cache_held is not None:
            cache = min(cache, prompt_cache_held)
        return b.weights + b.stream_state_total + cache + b.scratch_peak + b.workspace_peak

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {
            "verdict": self.verdict.value,
            "fits": self.fits,
            "reason": self.reason,
            "streams": self.streams,
            "context": self.context,
            "max_rows": self.max_rows,
            "eager": self.eager,
            "host_embeddings": self.host_embeddings,
            "prompt_cache_on_host": self.prompt_cache_on_host,
            "score_rows": self.score_rows,
            "kv_cache": self.kv_cache,
            "draft_tokens": self.draft_tokens,
            "drafting": self.drafting,
            "breakdown": asdict(self.breakdown),
            "suggestions": list(self.suggestions),
            "fixes": [list(f) for f in self.fixes],
            "prediction": asdict(self.prediction) if self.prediction else None,
        }

    def format_table(self) -> str:
        """A plain-text table for the terminal."""
        b = self.breakdown
        rows = [
            ("weights on the card", b.weights),
            ("embeddings in host memory", b.embeddings_on_host),
            (
                f"stream state ({b.stream_state_each / 2**20:,.1f} MiB x {b.streams})",
                b.stream_state_total,
            ),
            ("prompt cache", b.prompt_cache),
            ("prompt cache in host memory", b.prompt_cache_on_host),
            ("scratch" + (" (whole)" if self.eager else " (growth peak)"), b.scratch_peak),
            ("workspace" + (" (whole)" if self.eager else " (growth peak)"), b.workspace_peak),
            ("reserve", b.reserve),
            ("free after" if b.free_after >= 0 else "missing", abs(b.free_after)),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"verdict: {self.verdict.value} - {self.reason}"]
        card = f"card: {_gib(b.card_free)} free of {_gib(b.card_total)}"
        if b.limit is not None:
            card += f", limit {_gib(b.limit)} ({_gib(b.held)} held)"
        lines.append(card)
        if self.fits:
            lines.append(
                f"admitted: {streams_text(self.streams)} at {tokens_text(self.context)}, "
                f"max rows {self.max_rows}, scratch {'eager' if self.eager else 'lazy'}"
                + (", 8-bit KV cache" if self.kv_cache == "int8" else "")
            )
        lines += [f"  {name:<{width}}  {_gib(n):>12}" for name, n in rows]
        if self.prediction is not None:
            lines.append(f"speed: {self.prediction.sentence()}")
        if self.drafting:  # "drafts 2 tokens a step ...", or why drafting is unavailable
            lines.append(self.drafting[0].upper() + self.drafting[1:])
        lines += [f"  - {text}" for text in self.suggestions]
        return "\n".join(lines)


def streams_text(n: int) -> str:
    """'1 stream', '1,024 streams': how a count of concurrent streams reads in a sentence."""
    return f"{n:,} stream" if n == 1 else f"{n:,} streams"


def tokens_text(n: int) -> str:
    """'1 token', '4,096 tokens'."""
    return f"{n:,} token" if n == 1 else f"{n:,} tokens"


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"
