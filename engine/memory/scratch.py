"""The forward scratch: every intermediate buffer of one forward pass, in one device block.

`scratch_layout(config, rows, dtype_bytes)` is the measure path: it returns names, shapes,
offsets and bytes and touches nothing (invariant 3). `Scratch` owns the live block, grows it
(replacement first, see `engine.memory.growth`) and carves the layout into views.

Layout of one block for R rows (offsets 256-byte aligned, in this order; dt = compute dtype,
S = step rows (<= R), N = ceil(R / 64) DeltaNet chunks, P = KV splits of a decode step):

    offset 0
    +-- ids, positions  [R] i32 each ---------------------------------------+ token layout
    +-- x [R,H] dt   residual | u [R,H] dt  normed | delta [R,H] dt  out    | residual path
    +-- qg [R,2*Hq*hd] dt | k, v [R,Hkv*hd] dt | attn [R,Hq*hd] dt          | full attention
    |   attn_acc [R,Hq*hd] f32 | attn_ml [R,Hq,2] f32  (flash partials)     |
    |   split_acc [S,P,Hq*hd] f32 | split_ml [S,P,Hq,2] f32 (split-KV step)  |
    +-- mixed, conv [R,C] dt | z [R,VD] dt | a, b [R,Hv] dt | gates [R,2Hv] f32 | DeltaNet
    |   chunk_attn [N,Hv,64,64] f32 | chunk_k [N,Hv,64,dk] | chunk_v [N,Hv,64,dv] |
    |   gdn [R,VD] dt                                                       |
    +-- gate, up, act [R,I] dt                                              | SwiGLU MLP
    +-- logits [S,V] f32                                                    | head
    total (rounded up to 256)

Every layer reuses the same buffers; only the state (KV, conv, recurrent) is per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.config import ModelConfig
from engine.errors import ScratchGrowFailed
from engine.memory.growth import GrowableBuffer
from engine.memory.pool import Allocation, DevicePool

ALIGN = 256
GDN_CHUNK = 64
KV_SPLITS = 16
DTYPE_NAMES = {2: "float16", 4: "float32"}


@dataclass(frozen=True)
class BufferSpec:
    """One named buffer of a layout: `nbytes` bytes at `offset` into the block."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ScratchLayout:
    """Where every buffer of a forward over `rows` rows sits; `total_bytes` is the block size."""

    rows: int
    step_rows: int
    dtype_bytes: int
    buffers: tuple[BufferSpec, ...]
    total_bytes: int

    def get(self, name: str) -> BufferSpec:
        for spec in self.buffers:
            if spec.name == name:
                return spec
        raise KeyError(f"scratch has no buffer {name!r}")


def align_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _itemsize(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4}[dtype]


def scratch_layout(
    config: ModelConfig, rows: int, dtype_bytes: int = 2, step_rows: int | None = None
) -> ScratchLayout:
    """Measure the scratch for a forward over `rows` rows (pure: nothing is allocated).

    step_rows bounds the rows that need logits and split-KV decode partials (the streams of a
    step batch); None means `rows`.
    """
    if dtype_bytes not in DTYPE_NAMES:
        raise ValueError(f"compute dtype size {dtype_bytes} must be 2 (fp16/bf16) or 4 (fp32)")
    c, R = config, rows
    S = min(R, step_rows if step_rows is not None else R)
    N = math.ceil(R / GDN_CHUNK)
    dt, f32 = DTYPE_NAMES[dtype_bytes], "float32"
    Hq, Hkv, hd, Hv = (
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.linear_num_value_heads,
    )
    dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
    wanted: list[tuple[str, tuple[int, ...], str]] = [
        ("ids", (R,), "int32"),
        ("positions", (R,), "int32"),
        ("x", (R, c.hidden_size), dt),
        ("u", (R, c.hidden_size), dt),
        ("delta", (R, c.hidden_size), dt),
        ("qg", (R, 2 * Hq * hd), dt),
        ("k", (R, Hkv * hd), dt),
        ("v", (R, Hkv * hd), dt),
        ("attn", (R, Hq * hd), dt),
        ("attn_acc", (R, Hq * hd), f32),
        ("attn_ml", (R, Hq, 2), f32),
        ("split_acc", (S, KV_SPLITS, Hq * hd), f32),
        ("split_ml", (S, KV_SPLITS, Hq, 2), f32),
        ("mixed", (R, c.conv_dim), dt),
        ("conv", (R, c.conv_dim), dt),
        ("z", (R, c.value_dim), dt),
        ("a", (R, Hv), dt),
        ("b", (R, Hv), dt),
        ("gates", (R, 2 * Hv), f32),
        ("chunk_attn", (N, Hv, GDN_CHUNK, GDN_CHUNK), f32),
        ("chunk_k", (N, Hv, GDN_CHUNK, dk), f32),
        ("chunk_v", (N, Hv, GDN_CHUNK, dv), f32),
        ("gdn", (R, c.value_dim), dt),
        ("gate", (R, c.intermediate_size), dt),
        ("up", (R, c.intermediate_size), dt),
        ("act", (R, c.intermediate_size), dt),
        ("logits", (S, c.vocab_size), f32),
    ]
    offset, specs = 0, []
    for name, shape, dtype in wanted:
        nbytes = math.prod(shape) * _itemsize(dtype)
        specs.append(BufferSpec(name, shape, dtype, offset, nbytes))
        offset = align_up(offset + nbytes)
    return ScratchLayout(R, S, dtype_bytes, tuple(specs), offset if R > 0 else 0)


def scratch_bytes(
    config: ModelConfig, rows: int, dtype_bytes: int = 2, step_rows: int | None = None
) -> int:
    """Block size for `rows` rows (0 rows -> 0 bytes)."""
    if rows <= 0:
        return 0
    return scratch_layout(config, rows, dtype_bytes, step_rows).total_bytes


class Scratch(GrowableBuffer):
    """The live scratch block. `ensure(rows)` before a forward; `carve()` for the views.

    Register `on_before_free` (destroy CUDA graphs that point into the block) and
    `on_after_grow` (capture them again) once, at warm-up. When the full scratch fits,
    call `ensure(max_rows)` at warm-up so no request ever grows it (invariant 4).
    """

    tag = "scratch"
    error = ScratchGrowFailed

    def __init__(
        self,
        pool: DevicePool,
        config: ModelConfig,
        dtype_bytes: int,
        max_rows: int,
        step_rows: int | None = None,
    ) -> None:
        super().__init__(pool, max_rows)
        self.config = config
        self.dtype_bytes = dtype_bytes
        self.step_rows = step_rows
        self._layout: ScratchLayout | None = None

    def size_for(self, rows: int) -> int:
        return scratch_bytes(self.config, rows, self.dtype_bytes, self.step_rows)

    def measure(self, rows: int) -> ScratchLayout:
        """The layout for `rows` rows; the live block and its views are not touched."""
        return scratch_layout(self.config, rows, self.dtype_bytes, self.step_rows)

    @property
    def layout(self) -> ScratchLayout | None:
        """The layout carved into the live block (None before the first grow)."""
        return self._layout

    def _carve(self, block: Allocation, rows: int) -> dict[str, Any]:
        layout = self.measure(rows)
        views = {s.name: block.view(s.offset, s.shape, s.dtype) for s in layout.buffers}
        self._pending_layout = layout
        return views

    def _swapped(self) -> None:
        self._layout = self._pending_layout

    def release(self) -> None:
        super().release()
        self._layout = None
