"""Device memory: pools, the plan, admission, and the growable scratch and workspace.

Memory goes plan -> admit -> commit: `make_plan` computes bytes, `admit` decides (a
`Decision`, never an exception for "does not fit"), and the session allocates through a
pool what the decision says. `plan_for_checkpoint` does the first two in one call.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.config import EngineSettings, ModelConfig
from engine.memory.admission import admit, available_bytes, largest_context
from engine.memory.decision import Breakdown, Decision, Verdict
from engine.memory.plan import Plan, WeightBytes, make_plan, stream_state_bytes
from engine.memory.pool import CupyPool, DevicePool, SimulatedPool
from engine.memory.scratch import Scratch, ScratchLayout, scratch_layout
from engine.memory.workspace import Workspace, workspace_bytes


def plan_for_checkpoint(
    tensor_nbytes: Mapping[str, int],
    config: ModelConfig,
    context: int,
    streams: int,
    max_rows: int,
    card_total: int,
    card_free: int,
    held: int = 0,
    settings: EngineSettings | None = None,
    dtype_bytes: int = 2,
    prompt_cache_states: int | None = None,
) -> Decision:
    """Plan and admit a checkpoint (internal name -> stored nbytes) on a card."""
    plan = make_plan(
        tensor_nbytes, config, context, streams, max_rows, dtype_bytes, prompt_cache_states
    )
    return admit(plan, card_free, card_total, held, settings or EngineSettings())


__all__ = [
    "Breakdown",
    "CupyPool",
    "Decision",
    "DevicePool",
    "Plan",
    "Scratch",
    "ScratchLayout",
    "SimulatedPool",
    "Verdict",
    "WeightBytes",
    "Workspace",
    "admit",
    "available_bytes",
    "largest_context",
    "make_plan",
    "plan_for_checkpoint",
    "scratch_layout",
    "stream_state_bytes",
    "workspace_bytes",
]
