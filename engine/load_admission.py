"""A load's admission: the checkpoint planned against the backend's card before anything
is allocated (`Engine.load`; device tests replace it to force an arrangement)."""

from __future__ import annotations

from typing import Any

from engine.backends.base import Backend
from engine.config import EngineSettings
from engine.errors import DoesNotFit
from engine.memory import Card, Decision, checkpoint_specs, decide
from engine.memory.arena import act_itemsize


def admit_load(
    checkpoint: Any,
    backend: Backend,
    settings: EngineSettings,
    context: int | None,
    streams: int,
    max_rows: int | None,
) -> Decision:
    """Plan `checkpoint` against the backend's card before anything is allocated, through
    the one admission route (`engine.memory.decide`); DoesNotFit with its suggestions."""
    assert backend.pool is not None
    # The planner sizes activations from the settings; the backend must agree.
    assert backend.act_itemsize == act_itemsize(settings), (backend.act_itemsize, settings)
    pool = backend.pool
    from engine.device import probe_gpu

    gpu = probe_gpu()  # NVML: the card's bandwidth and tensor throughput, for the prediction
    speed = gpu.speed if gpu is not None else None
    fused = backend.fused_prefill_attention(checkpoint.config)
    card = Card(pool.card_total(), pool.card_free(), backend.held_bytes(), speed, fused)
    decision = decide(
        checkpoint_specs(checkpoint),
        checkpoint.config,
        settings,
        card,
        context=context,
        streams=streams,
        max_rows=max_rows,
    )
    if not decision.fits:
        hints = "; ".join(decision.suggestions) or "choose a smaller model"
        raise DoesNotFit(
            f"{checkpoint.dir.name} does not fit: {decision.reason}. To make it fit: {hints}",
            decision,
        )
    return decision
