"""A DeltaNet layer's input group telling its step kernel which rows are stored.

A decode step's DeltaNet layer is two dependent launches: the input group (one gemv4 over
in_proj_qkv, b, a and z) and the step kernel (`gdn_step_split`: conv, gates, delta rule).
Under programmatic dependent launch the step kernel would wait at `griddepcontrol.wait` for
the whole input group to end and its writes to be flushed. Signalled, the input group's
blocks set a flag for each virtual block of rows they store (after a fence), and each
thread of the step kernel waits only for the flags of the rows it reads, so the delta rule
runs while the group's last rows, z (stored last: weights.FUSED_GROUPS), are still being
computed. The step kernel waits for the group's end only before its own (out_proj reads z).

Flags are zero between layers: the last step block to take a ticket (after every block has
read past its flags) clears them, and the next layer's group sets them only after its own
wait, which follows this step kernel's end. Only the forward's one-row launches are armed
(`Projections.norm_linear_many`); a group armed without a step kernel after it (a one-row
prompt window) has its flags cleared by `DeltaNet.core`. Where no cluster step kernel runs
(`deltanet.split_shape`), nothing is armed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The most flags a group may set (rows / 16-row tiles of the largest group, with room).
MAX_FLAGS = 4096


class StepSignals:
    """Owns the flags and the ticket; `arm` at the group's launch, `take` at the step's."""

    def __init__(self) -> None:
        self.flags: Any = None  # uint32 [MAX_FLAGS], zero between layers
        self.ticket: Any = None  # uint32 [1], zero between layers
        self.enabled = False
        self.pending: tuple[int, int] | None = None  # (rows a flag, flags) of the armed group

    def alloc(self, enabled: bool) -> None:
        import cupy

        self.enabled, self.pending = enabled, None
        if enabled and self.flags is None:
            self.flags = cupy.zeros(MAX_FLAGS, cupy.uint32)
            self.ticket = cupy.zeros(1, cupy.uint32)

    @property
    def nbytes(self) -> int:
        return 0 if self.flags is None else self.flags.nbytes + self.ticket.nbytes

    def arm(self, signal_rows: int, choice: tuple) -> tuple | None:
        """The gemv4 launch's (flags, count) for a group whose first `signal_rows` rows the
        step kernel reads, where `choice` (a gemv4 variant) runs it; None: not signalled."""
        self.pending = None
        if not self.enabled or choice[0] != "mma" or signal_rows <= 0:
            return None
        rows = 16 * choice[2]  # a virtual block: tiles a block x 16 rows (gemv4.cu)
        n = -(-signal_rows // rows)
        if n > MAX_FLAGS:
            return None
        self.pending = (rows, n)
        return self.flags, np.int32(n)

    def take(self) -> tuple[int, int] | None:
        """What the last armed launch flags, once (the step kernel's, or to be cleared)."""
        pending, self.pending = self.pending, None
        return pending
