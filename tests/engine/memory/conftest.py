"""Shared pieces for the memory tests: shapes, and a commit that follows a Decision."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.memory import Decision, Plan, Scratch, SimulatedPool, Workspace, make_plan
from engine.memory.shapes import shape_config, shape_tensor_nbytes


def shape_plan(name: str, fmt: str = "mlx4", **kw) -> Plan:
    config = shape_config(name, fmt)
    return make_plan(shape_tensor_nbytes(config, fmt), config, **kw)


@dataclass
class Committed:
    """What a session holds after committing a decision on a pool."""

    pool: SimulatedPool
    arena: object
    embeddings: object | None
    scratch: Scratch
    workspace: Workspace
    streams: list
    cache: list


def commit(plan: Plan, decision: Decision, pool: SimulatedPool) -> Committed:
    """Allocate in the order a session does: weights, eager blocks, stream states, cache."""
    assert decision.fits
    w = plan.weights
    arena = pool.alloc(w.required_on_card, "arena")
    emb = None if decision.host_embeddings or w.tied else pool.alloc(w.embedding, "embeddings")
    used = plan.resized(max_rows=decision.max_rows)
    scratch = Scratch(
        pool,
        plan.config,
        plan.dtype_bytes,
        decision.max_rows,
        step_rows=plan.streams,
        context=plan.context,
    )
    work = Workspace(
        pool, plan.config, plan.dtype_bytes, decision.max_rows, plan.context, kv_cache=plan.kv_cache
    )
    if decision.eager:
        scratch.ensure(decision.max_rows)
        work.ensure(decision.max_rows)
    streams = [pool.alloc(used.state.total, f"stream:{i}") for i in range(decision.streams)]
    on_card = 0 if decision.prompt_cache_on_host else used.prompt_cache_states
    cache = [pool.alloc(used.state.total, f"prompt_cache:{i}") for i in range(on_card)]
    return Committed(pool, arena, emb, scratch, work, streams, cache)


@pytest.fixture
def small_plan() -> Plan:
    return shape_plan("0.8B", "mlx4", context=2048, streams=2, max_rows=512)
