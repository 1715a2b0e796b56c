"""Device memory: pools, the plan, admission, and the growable scratch and workspace.

Memory goes plan -> admit -> commit: `make_plan` computes bytes, `admit` decides (a
`Decision`, never an exception for "does not fit"), and the session allocates through a
pool what the decision says. `decide` does the first two from tensor specs: the one route
that the load panel, `snug plan` and `Engine.load` share (docs/architecture.md, "Memory").
"""

from __future__ import annotations

from engine.memory.admission import (
    BASE_ROWS,
    Card,
    admit,
    available_bytes,
    decide,
    largest_context,
)
from engine.memory.arena import TensorSpec, arena_bytes, checkpoint_specs
from engine.memory.decision import Breakdown, Decision, Verdict
from engine.memory.plan import Plan, WeightBytes, make_plan, stream_state_bytes
from engine.memory.pool import CupyPool, DevicePool, SimulatedPool
from engine.memory.scratch import Scratch, ScratchLayout, scratch_layout
from engine.memory.workspace import Workspace, workspace_bytes

__all__ = [
    "BASE_ROWS",
    "Breakdown",
    "Card",
    "TensorSpec",
    "arena_bytes",
    "checkpoint_specs",
    "decide",
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
    "scratch_layout",
    "stream_state_bytes",
    "workspace_bytes",
]
