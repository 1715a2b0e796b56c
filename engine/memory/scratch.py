"""The forward scratch: every intermediate buffer of one forward pass, in one device block.

`scratch_layout(config, rows, dtype_bytes, step_rows, context)` is the measure path: it
returns names, shapes, offsets and bytes and touches nothing (invariant 3). `Scratch` owns
the live block, grows it (replacement first, see `engine.memory.growth`) and carves views.

A layer only needs the previous layer's output (residual x and the delta its MLP adds), so
layers alternate between two regions: layer i carves its temporaries from region i % 2, which
is reset when the layer starts, while it reads x and the delta from the other region. The
embedding goes to region 1 (as layer -1), the head to its own region. The CUDA backend carves in
exactly this order (a bump allocator per region, 256-byte aligned), so capture and replay
of a decode graph see the same addresses, and this layout is what it uses (dt = compute
dtype, R = rows, S = rows that produce logits (<= step rows), P = decode KV splits):

    offset 0
    +-- region 0: one layer's buffers: u, x [R,H] (input norm), then the larger of -+
    |     attention: qg [R,2*Hq*hd] | k, v [R,Hkv*hd] | q, attn [R,Hq*hd]           |
    |                step: split_acc [R,Hq,P,hd] f32, split_ml [R,Hq,P,2] f32       |
    |                window: heads [Hq,R,hd]                                         |
    |     DeltaNet:  mixed [R,C] | z [R,VD] | b, a [R,Hv] | gdn_q, gdn_k [R,KD] f32  |
    |                gdn_v, gdn_o [R,VD] f32 | gdn_g, gdn_beta [R,Hv] f32 | gdn [R,VD] |
    |     then: mixer_out, u1, x1 [R,H] | act, gate, up [R,I] | mlp_out [R,H]        |
    +-- region 1: the same size (also holds the embedding output x) ----------------+
    +-- head: x, delta, u, h [S,H] dt (last rows, final norm) | logits [S,V] dt ----+
    total (rounded up to 256)

Both the window (R rows of one stream) and the step (one row for each of up to `step_rows`
streams) shapes are measured; a region is sized for the larger. Every layer reuses the same
two regions; only the state (KV, conv, recurrent) is per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.errors import ScratchGrowFailed
from engine.memory.growth import GrowableBuffer
from engine.memory.pool import Allocation, DevicePool
from engine.model_config import ModelConfig

ALIGN = 256
DTYPE_NAMES = {2: "float16", 4: "float32"}
REGIONS = ("r0", "r1", "head")


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
    """Where every buffer of a forward over `rows` rows sits; `total_bytes` is the block size.

    `regions` maps r0 / r1 / head to (offset, bytes) for the bump allocator that carves them.
    """

    rows: int
    step_rows: int
    dtype_bytes: int
    buffers: tuple[BufferSpec, ...]
    regions: dict[str, tuple[int, int]]
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


# Blocks a KV head of the split-KV decode attention at most: enough to stream a long context
# at full bandwidth, few enough that a short reply in a long context launches few blocks
# that find nothing to do.
ATTN_SPLITS = 128


def decode_splits(context: int, cap: int | None = None) -> tuple[int, int]:
    """(least keys per split, splits at most) of the split-KV decode attention at `context`.
    A step at length n takes max(least, ceil(n / splits)) keys per split (attention.cu), so
    the split grows with the reply, not with the context it may reach; its grid does not,
    and `cap` (the decode graph for short rows, cuda/graphs.py) narrows it."""
    return 32, min(ATTN_SPLITS, cap or ATTN_SPLITS, -(-context // 32))


def _layer_buffers(c: ModelConfig, R: int, step: bool, context: int, dt: str):
    """One layer's buffers in carving order: the input norm, the attention or the DeltaNet
    mixer (the larger), then the MLP half that both kinds share."""
    f32 = "float32"
    Hq, Hkv, hd, H = c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size
    Hv, KD, VD = c.linear_num_value_heads, c.key_dim, c.value_dim
    attention = [
        ("qg", (R, 2 * Hq * hd), dt),
        ("k", (R, Hkv * hd), dt),
        ("v", (R, Hkv * hd), dt),
        ("q", (R, Hq * hd), dt),
        ("attn", (R, Hq * hd), dt),
    ]
    if step:
        _, P = decode_splits(context)
        attention += [("split_acc", (R, Hq, P, hd), f32), ("split_ml", (R, Hq, P, 2), f32)]
    else:
        attention += [("heads", (Hq, R, hd), dt)]
    deltanet = [
        ("mixed", (R, c.conv_dim), dt),
        ("z", (R, VD), dt),
        ("b", (R, Hv), dt),
        ("a", (R, Hv), dt),
        ("gdn_q", (R, KD), f32),
        ("gdn_k", (R, KD), f32),
        ("gdn_v", (R, VD), f32),
        ("gdn_g", (R, Hv), f32),
        ("gdn_beta", (R, Hv), f32),
        ("gdn_o", (R, VD), f32),
        ("gdn", (R, VD), dt),
    ]

    def size(bufs):
        return sum(align_up(math.prod(shape) * _itemsize(d)) for _, shape, d in bufs)

    has_attn, has_gdn = bool(c.full_layers), bool(c.linear_layers)
    if has_attn and (not has_gdn or size(attention) >= size(deltanet)):
        mixer = attention
    else:
        mixer = deltanet
    I = c.intermediate_size
    tail = [
        ("mixer_out", (R, H), dt),
        ("u1", (R, H), dt),
        ("x1", (R, H), dt),
        ("act", (R, I), dt),
        ("gate", (R, I), dt),
        ("up", (R, I), dt),
        ("mlp_out", (R, H), dt),
    ]
    return [("u", (R, H), dt), ("x", (R, H), dt)] + mixer + tail


def scratch_layout(
    config: ModelConfig,
    rows: int,
    dtype_bytes: int = 2,
    step_rows: int | None = None,
    context: int = 4096,
) -> ScratchLayout:
    """Measure the scratch for forwards of up to `rows` rows (pure: nothing is allocated).

    step_rows bounds the rows of a decode step (the streams) and so the rows that need logits;
    None means `rows`. context sizes the split-KV decode partials.
    """
    if dtype_bytes not in DTYPE_NAMES:
        raise ValueError(f"compute dtype size {dtype_bytes} must be 2 (fp16/bf16) or 4 (fp32)")
    c, R = config, rows
    S = min(R, step_rows if step_rows is not None else R)
    dt = DTYPE_NAMES[dtype_bytes]
    window = _layer_buffers(c, R, False, context, dt)
    step = _layer_buffers(c, S, True, context, dt)

    def size(bufs):
        return sum(align_up(math.prod(shape) * _itemsize(d)) for _, shape, d in bufs)

    layer = window if size(window) >= size(step) else step
    H = c.hidden_size
    head = [(n, (S, H), dt) for n in ("x", "delta", "u", "h")] + [("logits", (S, c.vocab_size), dt)]
    offset, specs, regions = 0, [], {}
    for region, bufs in (("r0", layer), ("r1", layer), ("head", head)):
        base = offset
        for name, shape, dtype in bufs:
            nbytes = math.prod(shape) * _itemsize(dtype)
            specs.append(BufferSpec(f"{region}.{name}", shape, dtype, offset, nbytes))
            offset = align_up(offset + nbytes)
        regions[region] = (base, offset - base)
    total = offset if R > 0 else 0
    return ScratchLayout(R, S, dtype_bytes, tuple(specs), regions, total)


def scratch_bytes(
    config: ModelConfig,
    rows: int,
    dtype_bytes: int = 2,
    step_rows: int | None = None,
    context: int = 4096,
) -> int:
    """Block size for `rows` rows (0 rows -> 0 bytes)."""
    if rows <= 0:
        return 0
    return scratch_layout(config, rows, dtype_bytes, step_rows, context).total_bytes


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
        context: int = 4096,
    ) -> None:
        super().__init__(pool, max_rows)
        self.config = config
        self.dtype_bytes = dtype_bytes
        self.step_rows = step_rows
        self.context = context
        self._layout: ScratchLayout | None = None

    def size_for(self, rows: int) -> int:
        return scratch_bytes(self.config, rows, self.dtype_bytes, self.step_rows, self.context)

    def measure(self, rows: int) -> ScratchLayout:
        """The layout for `rows` rows; the live block and its views are not touched."""
        return scratch_layout(self.config, rows, self.dtype_bytes, self.step_rows, self.context)

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
