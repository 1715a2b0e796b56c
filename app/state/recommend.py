"""The first-run recommendation: which catalog model to start with on this machine, and why.

With a GPU: the largest catalog model whose verdict at WELCOME_CONTEXT tokens and one stream
says it fits (the FitAdvisor's verdicts: the Models tab's planning). Larger means more
parameters; between the two formats of one size, bf16 (the reference weights) beats 4-bit.
Without one: on the CPU every token reads all the weights, so the reply speed falls with the
model's bytes; the pick is the largest 4-bit model of at most CPU_MAX_BYTES that fits in RAM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.planning import PlanProblem, fmt_bytes
from app.state.catalog import Entry
from app.state.fit import verdict_fits

WELCOME_CONTEXT = 8192
CPU_MAX_BYTES = 600_000_000  # stored weights: the 0.8B 4-bit model, ~7 tokens/s on 2 cores


@dataclass(frozen=True)
class Recommendation:
    """`entry` is None when nothing fits; `why` says what was decided and why, in words."""

    entry: Entry | None
    why: str
    pending: bool = False


def params_of(entry: Entry) -> float:
    """Billions of parameters from the catalog shape name ("0.8B" -> 0.8)."""
    try:
        return float((entry.shape or "0").rstrip("Bb"))
    except ValueError:
        return 0.0


def _rank(entry: Entry) -> tuple[float, int]:
    return (params_of(entry), 1 if entry.fmt == "bf16" else 0)


def recommend(
    entries: Sequence[Entry], verdict: Callable[[Entry], Any], on_cpu: bool
) -> Recommendation:
    """Pick from the catalog entries, given each one's verdict (`verdict(entry)`)."""
    catalog = sorted((e for e in entries if e.source == "catalog"), key=_rank, reverse=True)
    verdicts = {e.key: verdict(e) for e in catalog}
    checking = [v for v in verdicts.values() if isinstance(v, PlanProblem)]
    if any(v.verdict_label == "Checking…" for v in checking):
        return Recommendation(None, "Checking which models fit this machine…", pending=True)
    fitting = [e for e in catalog if verdict_fits(verdicts[e.key])]
    if on_cpu:
        return _cpu_pick(catalog, fitting, verdicts)
    if not fitting:
        smallest = catalog[-1] if catalog else None
        reason = str(getattr(verdicts.get(smallest.key if smallest else ""), "reason", ""))
        return Recommendation(
            None,
            f"No catalog model fits this card at {WELCOME_CONTEXT:,} tokens, not even the "
            f"smallest. {reason}".strip(),
        )
    best = fitting[0]
    larger = [e for e in catalog if _rank(e) > _rank(best)]
    why = (
        f"Snug planned every catalog model with a context of {WELCOME_CONTEXT:,} tokens and "
        f"one stream (the check the Models tab makes). The largest that fits is {best.title}: "
        f"{_needs(verdicts[best.key])}"
    )
    if larger:
        nearest = larger[-1]
        needs = _needs(verdicts[nearest.key])
        why += f" The next larger one, {nearest.title}, does not fit: {needs}"
    return Recommendation(best, why)


def _cpu_pick(catalog: list[Entry], fitting: list[Entry], verdicts: dict) -> Recommendation:
    small = [e for e in fitting if e.fmt == "mlx4" and e.size_bytes <= CPU_MAX_BYTES]
    if not small:
        return Recommendation(
            None,
            "No NVIDIA GPU, and no small 4-bit model fits in the RAM available now. Close "
            "other programs, or open a local folder under Models.",
        )
    best = small[0]
    why = (
        "No NVIDIA GPU was found, so models run on the CPU (the numpy backend). There, every "
        "token reads all the weights, so replies slow down as models grow: Snug picks the "
        f"smallest 4-bit model, {best.title} ({fmt_bytes(best.size_bytes)} to download). "
        f"{_needs(verdicts[best.key])} Larger models are under Models, each with its RAM check."
    )
    return Recommendation(best, why)


def _needs(decision: Any) -> str:
    """The numbers behind a verdict, as a sentence."""
    reason = str(getattr(decision, "reason", "") or "").strip().rstrip(".")
    breakdown = getattr(decision, "breakdown", None)
    weights = getattr(breakdown, "weights", None)
    free = getattr(breakdown, "free_after", None)
    if weights is None or free is None or not verdict_fits(decision):
        return f"{reason}." if reason else ""
    return f"weights {fmt_bytes(weights)}, and {fmt_bytes(free)} still free ({reason})."
