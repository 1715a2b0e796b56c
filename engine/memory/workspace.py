"""The prompt-projection workspace: room to run prompt-sized matmuls on quantized weights.

A prefill chunk of R rows multiplies by every projection of a layer. With 4- or 8-bit
weights the fast path dequantizes one projection at a time into a tile and runs a dense
GEMM, so the workspace holds the largest layer projection dequantized plus one compute-dtype
copy of a chunk's activations at the widest input:

    +-- tile  [max out, max in] dt (largest out*in of the quantized layer linears) --+
    +-- acts  [R, max in] dt ---------------------------------------------------------+

The embedding and the head never go through it (the head sees only step rows). A model with
unquantized weights needs no workspace. It grows on demand like the scratch
(`engine.memory.growth`), and a failed grow raises WorkspaceGrowFailed and keeps the old one.
"""

from __future__ import annotations

from typing import Any

from engine.config import ModelConfig
from engine.errors import WorkspaceGrowFailed
from engine.memory.growth import GrowableBuffer
from engine.memory.pool import Allocation, DevicePool
from engine.memory.scratch import DTYPE_NAMES, align_up
from engine.memory.shapes import layer_linear_shapes


def _widest(config: ModelConfig) -> tuple[int, int]:
    """(largest out*in, largest in) over the layer projections."""
    shapes = [(out, inp) for _, out, inp in layer_linear_shapes(config)]
    return max(o * i for o, i in shapes), max(i for _, i in shapes)


def workspace_bytes(config: ModelConfig, rows: int, dtype_bytes: int = 2) -> int:
    """Workspace size for prefill chunks of `rows` rows (0 when the weights are not quantized)."""
    if rows <= 0 or not config.quantized:
        return 0
    tile, widest_in = _widest(config)
    return align_up(tile * dtype_bytes) + align_up(rows * widest_in * dtype_bytes)


class Workspace(GrowableBuffer):
    """The live workspace block; `ensure(rows)` before a quantized prefill chunk of `rows` rows."""

    tag = "workspace"
    error = WorkspaceGrowFailed

    def __init__(
        self, pool: DevicePool, config: ModelConfig, dtype_bytes: int, max_rows: int
    ) -> None:
        super().__init__(pool, max_rows)
        self.config = config
        self.dtype_bytes = dtype_bytes

    def size_for(self, rows: int) -> int:
        return workspace_bytes(self.config, rows, self.dtype_bytes)

    def ensure(self, rows: int) -> bool:
        if not self.config.quantized:
            return False
        return super().ensure(rows)

    def _carve(self, block: Allocation, rows: int) -> dict[str, Any]:
        tile, widest_in = _widest(self.config)
        dt = DTYPE_NAMES[self.dtype_bytes]
        return {
            "tile": block.view(0, (tile,), dt),
            "acts": block.view(align_up(tile * self.dtype_bytes), (rows, widest_in), dt),
        }
