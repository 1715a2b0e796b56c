"""Weights on the device: one arena allocated at load, carved into every tensor.

Quantized matrices stay packed (uint32 codes) with scales and biases in the activation type;
4-bit g64 matrices that the tensor-core decode kernel reads are rearranged into 8-row blocks
(`QWeight.blocked`; rows are carved to a multiple of 8). Dense matrices are stored in the
activation type (bf16 stays bf16); norms, conv1d, A_log and dt_bias are small and kept in
fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.memory.arena import ALIGN, arena_bytes, checkpoint_specs, is_small, padded, rows8

if TYPE_CHECKING:
    from engine.backends.cuda.norms import Norms
    from engine.backends.cuda.projections import Projections


@dataclass
class QWeight:
    """An MLX affine-quantized `[out, in]` matrix on the device."""

    packed: Any  # uint32 [out, in*bits/32]
    scales: Any  # act [out, in/group]
    biases: Any  # act [out, in/group]
    bits: int
    group_size: int
    shape: tuple[int, int]
    fused: Any = None  # the QWeight of its group of projections, when stored as one
    row0: int = 0  # first row of this part inside `fused`
    # Rows in blocks of 8 (kernels/quant.cu, to_blocks): per block and group of 64 columns,
    # the 8 rows' codes one after another, and their scales (biases) likewise, so a warp
    # reads whole lines. The arrays keep the [rows, ...] shape; memory runs to a multiple of
    # 8 rows. An 8-aligned run of rows covers the same bytes in either order.
    blocked: bool = False

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + self.biases.nbytes


# Projections that read the same input, stored back to back so a decode step multiplies
# them in one launch (engine.backends.base.Backend.linear_many).
FUSED_GROUPS = (
    ("linear_attn.", ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")),
    ("self_attn.", ("q_proj", "k_proj", "v_proj")),
)


def fused_groups(tensors: Any, names: list[str]) -> dict[str, list[str]]:
    """First name of each fusable group -> the group's names, for groups whose parts are all
    quantized alike with the same input width and whose part boundaries stay 16-byte aligned
    in the output (so every part's slice of a one-row output can be read with vector loads).
    `tensors`: name -> what has `.shape` and `.quant` (a checkpoint's tensors, or specs)."""
    present = set(names)
    out: dict[str, list[str]] = {}
    layers = {n.split(".")[1] for n in names if n.startswith("layers.")}
    for i in layers:
        for prefix, parts in FUSED_GROUPS:
            group = [f"layers.{i}.{prefix}{p}" for p in parts]
            if not all(g in present for g in group):
                continue
            infos = [tensors[g] for g in group]
            q0 = infos[0].quant
            if q0 is None or any(t.quant != q0 or t.shape[1] != infos[0].shape[1] for t in infos):
                continue
            if any(t.shape[0] % 8 for t in infos[:-1]):  # 8 half values = 16 bytes
                continue
            out[group[0]] = group
    return out


@dataclass
class DWeight:
    """A dense `[out, in]` matrix in the activation type."""

    data: Any
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


class Arena:
    """One device block (from the pool when given one); `carve` hands out aligned views."""

    def __init__(self, nbytes: int, pool: Any = None):
        import cupy

        nbytes = max(nbytes, ALIGN)
        self.alloc = pool.alloc(nbytes, "weights") if pool is not None else None
        if self.alloc is not None:
            self.block = self.alloc.view(0, (nbytes,), "uint8")
        else:
            self.block = cupy.empty(nbytes, dtype=cupy.uint8)
        self.offset = 0

    @property
    def nbytes(self) -> int:
        return self.block.nbytes

    def carve(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import cupy

        dt = cupy.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        start = self.offset
        self.offset += padded(n)
        assert self.offset <= self.block.nbytes, (self.offset, self.block.nbytes)
        return self.block[start : start + n].view(dt).reshape(shape)


def _convert_into(norms: Norms, raw: np.ndarray, dst: Any) -> None:
    """Upload a host array (bf16 as uint16, f16 or f32) and convert it into `dst`."""
    import cupy

    if raw.dtype == np.uint16:
        kind = "from_bf16"
    elif raw.dtype == np.float16:
        kind = "from_f16"
    else:
        raw = raw.astype(np.float32, copy=False)
        kind = "from_f32"
    tmp = cupy.asarray(np.ascontiguousarray(raw))
    norms.convert(kind, tmp.reshape(-1), dst.reshape(-1))


def upload(
    checkpoint: Any,
    norms: Norms,
    projections: Projections,
    pool: Any = None,
    skip: tuple[str, ...] = (),
    mtp: bool = False,
) -> tuple[dict[str, Any], Arena]:
    """Upload every tensor the forward reads into one arena; return name -> device weight.
    Tensors named in `skip` stay on the host (an embedding table the plan put there); the
    MTP head's (`mtp.*`) only with `mtp` (drafting). `norms` converts to the activation
    type, `projections` puts 4-bit matrices in blocks."""
    import cupy

    act = norms.k.act_dtype
    specs = checkpoint_specs(checkpoint)
    sized = arena_bytes(specs, norms.k.act_itemsize, mtp=mtp)
    sizes = {k: v for k, v in sized.items() if k not in skip}
    arena = Arena(sum(sizes.values()), pool)
    weights: dict[str, Any] = {}
    fusable = fused_groups(checkpoint.tensors, list(sizes))
    grouped = {n for g in fusable.values() for n in g}
    try:
        for name in sizes:
            info = checkpoint.tensors[name]
            shape = tuple(info.shape)
            if name in fusable:
                _upload_group(checkpoint, norms, projections, arena, fusable[name], weights)
            elif name in grouped:
                continue  # uploaded with its group
            elif info.quant is not None:
                _upload_group(checkpoint, norms, projections, arena, [name], weights)
            elif is_small(name, shape):
                arr = np.ascontiguousarray(checkpoint.read(name), dtype=np.float32)
                dst = arena.carve(arr.shape, cupy.float32)
                dst.set(arr)
                weights[name] = dst
            else:
                raw = np.asarray(checkpoint.read_raw(name))
                dst = arena.carve(shape, act)
                _convert_into(norms, raw.reshape(shape), dst)
                weights[name] = DWeight(dst, shape) if len(shape) == 2 else dst
        cupy.cuda.get_current_stream().synchronize()
    except BaseException:  # a tensor that cannot be read or converted: the arena goes back
        if arena.alloc is not None:
            arena.alloc.free()
        raise
    return weights, arena


def _upload_group(
    checkpoint: Any,
    norms: Norms,
    projections: Projections,
    arena: Arena,
    names: list[str],
    weights: dict,
) -> None:
    """Upload quantized projections as one [sum of out, in] matrix (one name: just that
    matrix); each part is a row view. Rows are carved to a multiple of 8 (the padding zeroed)
    and put in 8-row blocks where the decode kernel will read them
    (`Projections.blocks_ok`)."""
    import cupy

    infos = [checkpoint.tensors[n] for n in names]
    q, cols = infos[0].quant, infos[0].shape[1]
    rows = sum(t.shape[0] for t in infos)
    groups = cols // q.group_size
    dp = arena.carve((rows8(rows), cols * q.bits // 32), cupy.uint32)
    ds = arena.carve((rows8(rows), groups), norms.k.act_dtype)
    db = arena.carve((rows8(rows), groups), norms.k.act_dtype)
    for a in (dp, ds, db):
        a[rows:] = 0
    r0 = 0
    for info, name in zip(infos, names, strict=True):
        out = info.shape[0]
        packed, scales, biases = checkpoint.read_raw(name)
        part = slice(r0, r0 + out)
        dp[part].set(np.ascontiguousarray(packed).view(np.uint32).reshape(out, -1))
        _convert_into(norms, np.asarray(scales).reshape(out, groups), ds[part])
        _convert_into(norms, np.asarray(biases).reshape(out, groups), db[part])
        r0 += out
    blocked = projections.blocks_ok(q.bits, q.group_size, cols)
    if blocked:
        projections.to_blocks(dp, ds, db)
    dp, ds, db = dp[:rows], ds[:rows], db[:rows]
    whole = QWeight(dp, ds, db, q.bits, q.group_size, (rows, cols), blocked=blocked)
    if len(names) == 1:
        weights[names[0]] = whole
        return
    r0 = 0
    for name, info in zip(names, infos, strict=True):
        out = info.shape[0]
        part = slice(r0, r0 + out)
        weights[name] = QWeight(
            dp[part], ds[part], db[part], q.bits, q.group_size, (out, cols), whole, r0, blocked
        )
        r0 += out


def blocked_copy(projections: Projections, w: QWeight) -> QWeight:
    """A copy of a row-ordered 4-bit g64 matrix in 8-row blocks (for tests and benchmarks:
    `upload` blocks the checkpoint's matrices in place)."""
    import cupy

    rows = w.shape[0]
    padded = []
    for a in (w.packed, w.scales, w.biases):
        b = cupy.zeros((rows8(rows), a.shape[1]), a.dtype)
        b[:rows] = a
        padded.append(b)
    projections.to_blocks(*padded)
    p, s, b = (a[:rows] for a in padded)
    return QWeight(p, s, b, w.bits, w.group_size, w.shape, blocked=True)
