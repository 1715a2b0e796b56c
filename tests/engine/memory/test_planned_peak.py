"""The plan's peak against a pool that holds what the decision says: the saved prompt states
counted at their budget, or at what the cache holds (issue 26, item 6)."""

from __future__ import annotations

from engine.config import EngineSettings
from engine.memory import SimulatedPool, admit
from tests.engine.memory.conftest import commit


def _card(plan, cache: bool = True) -> int:
    """A card the plan fills exactly (reserve included), eager, with the default workspace."""
    w = plan.weights
    need = w.required_on_card + w.movable_to_host + plan.scratch_bytes + plan.workspace_bytes
    need += plan.stream_state_total + (plan.prompt_cache_bytes if cache else 0)
    return need + EngineSettings().reserve_bytes


def test_the_peak_counts_the_prompt_cache_at_its_budget_or_at_what_it_holds(small_plan):
    card = _card(small_plan)
    decision = admit(small_plan, card, card, settings=EngineSettings())
    assert decision.eager and not decision.prompt_cache_on_host
    pool = SimulatedPool(card)
    held = commit(small_plan, decision, pool)
    assert decision.planned_peak() == pool.peak_bytes  # every saved state at full size
    for block in held.cache:
        block.free()
    pool.reset_peak()
    assert pool.peak_bytes == pool.held_bytes
    saved = pool.alloc(small_plan.state.total // 3, "prompt_cache:0")  # a shorter prompt's
    assert decision.planned_peak(saved.nbytes) == pool.peak_bytes
    assert decision.planned_peak(10 * small_plan.prompt_cache_bytes) == decision.planned_peak()


def test_saved_states_in_host_memory_count_nothing_on_the_card(small_plan):
    card = _card(small_plan, cache=False)
    hosted = admit(small_plan, card, card, settings=EngineSettings())
    assert hosted.prompt_cache_on_host and hosted.breakdown.prompt_cache == 0
    pool = SimulatedPool(card)
    commit(small_plan, hosted, pool)
    assert hosted.planned_peak(small_plan.state.total) == pool.peak_bytes == hosted.planned_peak()
