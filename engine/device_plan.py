"""Admission for a device backend: plan the checkpoint against the card, before allocating.

The session calls `admit_on_device` after reading the checkpoint's headers and before
uploading a byte: it sizes the plan from what the backend will really put on the card
(`backend.weight_bytes`), reads the card's free memory and what Snug already holds from the
backend's pool, and returns the `Decision` (or raises `DoesNotFit` with its suggestions).
"""

from __future__ import annotations

from typing import Any

from engine.config import EngineSettings
from engine.errors import DoesNotFit

SMALLEST_CONTEXT = 256


def admit_on_device(
    backend: Any,
    checkpoint: Any,
    settings: EngineSettings,
    context: int | None,
    streams: int,
    max_rows: int,
) -> Any:
    """The decision for `context` tokens (None: the largest the card admits) and `streams`."""
    from engine.memory import admit, largest_context, make_plan

    config = checkpoint.config
    pool = backend.pool
    free, total, held = pool.card_free(), pool.card_total(), backend.held_bytes()
    weights = backend.weight_bytes(checkpoint)
    wanted = SMALLEST_CONTEXT if context is None else context
    plan = make_plan(weights, config, wanted, streams, max_rows, backend.act_itemsize)
    if context is None:
        best = largest_context(plan, free, total, held, settings)
        plan = plan.resized(context=max(best, SMALLEST_CONTEXT))
    decision = admit(plan, free, total, held, settings)
    if not decision.fits:
        hints = "; ".join(decision.suggestions) or "choose a smaller model"
        raise DoesNotFit(
            f"{checkpoint.dir.name} does not fit: {decision.reason}. To make it fit: {hints}",
            decision,
        )
    return decision
