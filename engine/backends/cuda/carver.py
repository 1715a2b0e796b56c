"""Per-forward device buffers carved by bump allocators from the scratch and workspace blocks.

The blocks themselves belong to `engine.memory` (`Scratch`, `Workspace`: sized by the plan,
grown replacement-first, graphs torn down before an old block is freed). This module only
hands out views, in the layout `engine.memory.scratch.scratch_layout` measures:

    scratch block
    +---------------- r0 ----------------+---------------- r1 ----------------+-- head --+
    | layer 0, 2, 4, ... (reset per layer)| embedding, layer 1, 3, 5, ...       | logits   |
    +-------------------------------------+-------------------------------------+----------+

Layer i carves from region i % 2 (reset when the layer starts) and reads the previous
layer's output from the other region. Carving order within a forward is deterministic, so a
captured decode graph and its replays see the same addresses. Without a block (kernel tests)
or in a `spill` region (the head asked for every row's logits, a dequantized head tile) a
take that does not fit comes from the CuPy pool instead; that is refused during capture.
"""

from __future__ import annotations

from typing import Any

from engine.memory.arena import ALIGN


def _nbytes(shape: tuple[int, ...], itemsize: int) -> int:
    n = itemsize
    for s in shape:
        n *= int(s)
    return n


class RegionCarver:
    """Bump allocation inside named regions `(offset, size)` of one block."""

    def __init__(self, name: str, spill: tuple[str, ...] = (), dtype: Any = None) -> None:
        self.name = name
        self.dtype = dtype  # what `take` carves when it is given no dtype
        self.spill = spill  # regions that may take from the CuPy pool when full (not in capture)
        self.block: Any = None  # an engine.memory Allocation
        self.regions: dict[str, tuple[int, int]] = {}
        self.region = ""
        self.offset = 0
        self.capturing = False
        self.used: dict[str, int] = {}  # most bytes each region has needed (for receipts)
        self._overflow: list[Any] = []
        # take's dtype argument -> (itemsize, name). A dtype's name is computed on each read
        # (about 4 us), and a 512-row prompt window of the 4B carves about 800 views.
        self._dtypes: dict[Any, tuple[int, str]] = {}

    def attach(self, block: Any, regions: dict[str, tuple[int, int]]) -> None:
        """Carve from `block` from now on (after the owner grew or replaced it)."""
        self.block, self.regions = block, dict(regions)

    def detach(self) -> None:
        self.block, self.regions = None, {}

    def begin(self, region: str) -> None:
        """Start carving `region` from its beginning (its previous views are dead)."""
        self.region, self.offset = region, 0

    def reset(self, region: str = "r1") -> None:
        """Start a forward: drop last forward's overflow and carve from `region`."""
        self._overflow.clear()
        self.begin(region)

    def take(self, shape: tuple[int, ...], dtype: Any = None) -> Any:
        """A view of `shape` (of `dtype`, else the carver's) at the region's next offset."""
        key = self.dtype if dtype is None else dtype
        known = self._dtypes.get(key)
        if known is None:
            import cupy

            dt = cupy.dtype(key)
            known = self._dtypes[key] = (dt.itemsize, dt.name)
        itemsize, name = known
        n = _nbytes(shape, itemsize)
        start, end = self.offset, self.offset + (n + ALIGN - 1) // ALIGN * ALIGN
        base, size = self.regions.get(self.region, (0, -1))
        if self.block is not None and end <= size:
            self.offset = end
            self.used[self.region] = max(self.used.get(self.region, 0), end)
            return self.block.view(base + start, shape, name)
        if self.capturing:
            raise RuntimeError(
                f"{self.name} region {self.region!r} holds {size} bytes but the captured "
                f"forward needs {end}; the layout in engine.memory.scratch must cover it"
            )
        if self.block is not None and self.region not in self.spill:
            raise AssertionError(
                f"{self.name} region {self.region!r} ({size} bytes) is smaller than the "
                f"forward needs ({end}); engine.memory.scratch's layout is out of date"
            )
        import cupy

        arr = cupy.empty(shape, dtype=name)
        self._overflow.append(arr)
        return arr
