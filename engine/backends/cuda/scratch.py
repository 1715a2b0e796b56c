"""Per-forward device buffers carved from one preallocated block by a bump allocator.

    scratch block (one cupy allocation, `capacity` bytes)
    +--------+--------+--------+------ ... ------+-----------------+
    | buf 0  | buf 1  | buf 2  |                 |   free          |
    +--------+--------+--------+------ ... ------+-----------------+
    ^ offset 0 (reset at the start of every forward)    ^ capacity

Allocation order within a forward is deterministic, so a captured decode graph and its
replays see the same addresses. When a forward needs more than the block holds (outside a
capture), the overflow comes from the CuPy pool for that forward only and `wanted` records
the peak; the next `reset` replaces the block with one of the peak size (the owner first
tears down graphs that point into the old block, through `on_grow`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ALIGN = 256


class Scratch:
    def __init__(self, capacity: int = 0, on_grow: Callable[[], None] | None = None):
        self.capacity = 0
        self.block: Any = None
        self.offset = 0
        self.wanted = 0
        self.capturing = False
        self.on_grow = on_grow
        self._overflow: list[Any] = []
        if capacity:
            self._allocate(capacity)

    @property
    def nbytes(self) -> int:
        return self.capacity

    def _allocate(self, capacity: int) -> None:
        import cupy

        self.block = None  # free the old block before taking the new one
        self.block = cupy.empty(capacity, dtype=cupy.uint8)
        self.capacity = capacity

    def reset(self) -> None:
        """Start a forward: free last forward's overflow and grow the block if it was short."""
        self._overflow.clear()
        if self.wanted > self.capacity:
            if self.on_grow is not None:
                self.on_grow()
            self._allocate(int(self.wanted * 1.25) // ALIGN * ALIGN + ALIGN)
        self.offset = 0
        self.wanted = 0

    def ensure(self, nbytes: int) -> None:
        """Grow now (outside a capture) so that `nbytes` fit from offset 0; content is lost."""
        if nbytes > self.capacity:
            if self.on_grow is not None:
                self.on_grow()
            self._allocate(int(nbytes * 1.25) // ALIGN * ALIGN + ALIGN)
        self.offset = 0

    def take(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised array carved from the block (or from the pool on overflow)."""
        import cupy

        dt = cupy.dtype(dtype)
        n = dt.itemsize
        for s in shape:
            n *= int(s)
        start = self.offset
        self.offset = start + (n + ALIGN - 1) // ALIGN * ALIGN
        self.wanted = max(self.wanted, self.offset)
        if self.offset <= self.capacity:
            return self.block[start : start + n].view(dt).reshape(shape)
        if self.capturing:
            raise RuntimeError(
                f"scratch of {self.capacity} bytes is too small for the captured forward "
                f"(needs {self.offset}); grow it before capture"
            )
        arr = cupy.empty(shape, dtype=dt)
        self._overflow.append(arr)
        return arr
