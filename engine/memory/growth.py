"""Geometric growth of a row-sized device buffer, replacement first (invariant 2).

Capacities climb a fixed ladder: 0, then powers of two from `MIN_ROWS`, capped at max_rows.
A grow to `rows` picks the smallest rung that is at least `rows` and at least twice the
current capacity. Because capacities only ever sit on the ladder (or at max_rows), the most
a grow can hold at once is known in advance: the largest rung below max_rows plus the full
buffer at max_rows. Admission counts that peak (invariant 1).

A grow allocates the new block first. If that fails, nothing changes (block, capacity,
carved views) and the named error goes to the one request that asked. If it succeeds, the
`before_free` callbacks run (CUDA graphs that point into the old block are destroyed:
invariant 5), the old block is freed, the new one is carved, then `after_grow` runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.errors import DeviceOutOfMemory, RequestRefused
from engine.memory.pool import Allocation, DevicePool

MIN_ROWS = 16


def next_capacity(capacity: int, rows: int, max_rows: int) -> int:
    """The capacity a grow from `capacity` to hold `rows` lands on (rows <= max_rows)."""
    want = max(rows, 2 * capacity, MIN_ROWS)
    rung = 1 << (want - 1).bit_length()
    return min(rung, max_rows)


def ladder_below(max_rows: int) -> list[int]:
    """Every rung strictly below max_rows."""
    out, rung = [], MIN_ROWS
    while rung < max_rows:
        out.append(rung)
        rung *= 2
    return out


def growth_peak(size: Callable[[int], int], from_rows: int, max_rows: int) -> int:
    """Most bytes held at once while growing from `from_rows` capacity up to max_rows.

    `size(rows)` must grow with rows. A grow holds old and new together, and the new block is
    never larger than the one at max_rows, so the worst grow is the last one, from the
    largest capacity the buffer can sit at below max_rows.
    """
    if from_rows >= max_rows:
        return size(from_rows)
    olds = [from_rows] + [r for r in ladder_below(max_rows) if r > from_rows]
    old = max(olds)
    return (size(old) if old > 0 else 0) + size(max_rows)


class GrowableBuffer:
    """One device block sized by rows, grown on demand; see the module docstring.

    Subclasses set `tag`, `error` (the RequestRefused subclass to raise), implement
    `size_for(rows)` (bytes, pure) and may override `_carve()` (views into the block).
    """

    tag = "buffer"
    error: type[RequestRefused] = RequestRefused
    setting_hint = "lower max rows, shorten the context, or raise the memory limit"

    def __init__(self, pool: DevicePool, max_rows: int) -> None:
        if max_rows <= 0:
            raise ValueError(f"max_rows = {max_rows} must be positive")
        self.pool = pool
        self.max_rows = max_rows
        self._block: Allocation | None = None
        self._capacity = 0
        self._views: dict[str, Any] = {}
        self._before_free: list[Callable[[], None]] = []
        self._after_grow: list[Callable[[int], None]] = []

    # ----- pure sizing ---------------------------------------------------------------------
    def size_for(self, rows: int) -> int:
        raise NotImplementedError

    def growth_peak_bytes(self, from_rows: int | None = None) -> int:
        """Most held at once growing from `from_rows` (default: current capacity) to max_rows."""
        start = self._capacity if from_rows is None else from_rows
        return growth_peak(self.size_for, start, self.max_rows)

    def pending_bytes(self) -> int:
        """Bytes admission must still keep free for this buffer: growth peak minus held."""
        return self.growth_peak_bytes() - self.nbytes

    # ----- state ---------------------------------------------------------------------------
    @property
    def capacity_rows(self) -> int:
        return self._capacity

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._block.nbytes if self._block is not None else 0

    @property
    def block(self) -> Allocation | None:
        return self._block

    def on_before_free(self, callback: Callable[[], None]) -> None:
        """Call `callback()` before an old block is freed (destroy graphs that use it)."""
        self._before_free.append(callback)

    def on_after_grow(self, callback: Callable[[int], None]) -> None:
        """Call `callback(new_capacity_rows)` once a grow is complete (recapture graphs)."""
        self._after_grow.append(callback)

    def carve(self) -> dict[str, Any]:
        """Views into the live block by name (the same objects until the next grow)."""
        return self._views

    def _carve(self, block: Allocation, rows: int) -> dict[str, Any]:
        return {}

    def _swapped(self) -> None:
        """Hook: the carved block has just become the live one."""

    # ----- growth --------------------------------------------------------------------------
    def ensure(self, rows: int) -> bool:
        """Make room for `rows` rows; True if it grew. On failure raise `self.error`, keep old."""
        if rows <= self._capacity:
            return False
        if rows > self.max_rows:
            raise ValueError(
                f"{self.tag}: {rows} rows asked but max rows is {self.max_rows}; the caller "
                "must chunk to max rows"
            )
        target = next_capacity(self._capacity, rows, self.max_rows)
        nbytes = self.size_for(target)
        try:
            new = self.pool.alloc(nbytes, self.tag)
        except DeviceOutOfMemory as exc:
            raise self._refusal(rows, target, nbytes, exc) from exc
        try:
            views = self._carve(new, target)
            for callback in self._before_free:
                callback()
        except BaseException:
            new.free()
            raise
        old, self._block, self._capacity, self._views = self._block, new, target, views
        if old is not None:
            old.free()
        self._swapped()
        for callback in self._after_grow:
            callback(target)
        return True

    def release(self) -> None:
        """Free the block (unload). Graph owners are told first."""
        if self._block is None:
            return
        for callback in self._before_free:
            callback()
        self._block.free()
        self._block, self._capacity, self._views = None, 0, {}

    def _refusal(self, rows: int, target: int, nbytes: int, cause: Exception) -> RequestRefused:
        err = self.error(
            f"{self.tag} could not grow to {target} rows for a request of {rows} rows: "
            f"{nbytes:,} more bytes were not available ({cause}). The {self._capacity}-row "
            f"{self.tag} ({self.nbytes:,} bytes) is kept and other streams go on; "
            f"{self.setting_hint} (max rows is {self.max_rows})."
        )
        err.rows = rows
        err.nbytes = nbytes
        err.capacity_kept = self._capacity
        return err
