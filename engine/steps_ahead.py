"""Decode steps launched ahead of their tokens (`Backend.launch_step`): the draw a launched
step makes, and the one step an engine's replies have in flight.

`Engine.generate` launches a reply's next step before the host reads the last one's token,
so the GPU computes token t + 1 while the host streams token t. The backend's
`launch_step(None)` follows the last step launched (its streams, fed by its picks on the
device), and the picks land in a ring that later steps reuse. Two replies of one engine
read in turns (each `generate` on its own stream) share that: before any other forward
runs, the step a reply left in flight gives its picks (`StepsAhead.settle`, which waits
for it), and that reply launches its next step afresh, with its own batch, instead of
following a step of another reply's.
"""

from __future__ import annotations

from typing import Any

from engine.sampling import Sampler


def draw(sampler: Sampler, generated: list[int], stream: Any) -> Any:
    """A launched step's pick: None for the step's greedy token, else a device draw."""
    if sampler.takes_argmax:
        return None
    return sampler.device_draw(generated, stream.slot)


class Launched:
    """A launched step's picks, read once (`tokens`); read early where another forward
    came first (`StepsAhead.settle`)."""

    def __init__(self, pending: Any):
        self._pending: Any = pending
        self._tokens: list[int] | None = None

    def tokens(self) -> list[int]:
        if self._tokens is None:
            self._tokens = self._pending.tokens()
            self._pending = None
        return self._tokens


class StepsAhead:
    """The engine's step in flight and the reply it belongs to (any object that names the
    reply: `owner`)."""

    def __init__(self, backend: Any):
        self.backend = backend
        self._owner: object | None = None
        self._last: Launched | None = None

    def launch(self, owner: object, batch: Any, ids: Any, rows: list) -> Launched:
        """`backend.launch_step(batch, ids, rows)` for `owner`'s reply. Batch None follows
        the step launched last, which must be `owner`'s (`follows`); a step with its own
        batch first settles whatever else is in flight."""
        if batch is None:
            if not self.follows(owner):
                raise RuntimeError("no step of this reply to follow: another forward ran since")
        else:
            self.settle()
        step = Launched(self.backend.launch_step(batch, ids, rows))
        self._owner, self._last = owner, step
        return step

    def follows(self, owner: object) -> bool:
        """Whether `owner`'s step is the last one launched, with no forward since: its next
        step can follow it."""
        return self._last is not None and self._owner is owner

    def settle(self) -> None:
        """Before any other forward: the step in flight gives its picks now (kept for its
        reply), and no step follows it."""
        last, self._owner, self._last = self._last, None, None
        if last is not None:
            last.tokens()
