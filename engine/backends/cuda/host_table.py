"""An embedding table in pinned host memory that the GPU reads in place (invariant 7).

Where the plan keeps an untied table off the card, it is copied once, at load, into pinned
host memory mapped into the device's address space. The embedding gather reads the rows a
forward needs over PCIe, inside the decode graph like every other kernel of the step, so a
step takes its input ids from the previous step's picks on the device exactly as with the
table on the card (launch-ahead keeps working). The table costs no device memory: the pool
never sees it, and admission counts it as "embeddings in host memory".

The layouts are those the gather kernels read on the card (quant.cu `embed_dense`,
`embed_q<bits, 0>`): a dense table in the activation type; a quantized one with its codes
(uint32) in MLX's row order, so each row is one contiguous run over PCIe, and its scales
and biases in the activation type.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.cuda.weights import DWeight, QWeight
from engine.bf16 import to_bf16
from engine.errors import DeviceOutOfMemory
from engine.memory.arena import padded

# Rows read from the checkpoint and converted at a time while the table is filled: bounds
# the float32 copy of a large table that passes through host memory.
ROWS_PER_READ = 4096


TABLE = (
    "the embedding table",
    "free host memory or choose a plan that keeps the table on the card",
)


def mapped(nbytes: int, use: tuple[str, str] = TABLE) -> tuple[np.ndarray, Any]:
    """`nbytes` of pinned host memory mapped into the device's address space: a uint8 host
    view and a CuPy uint8 array over the same bytes, for kernels. The memory lives as long
    as either of them (or a view of one). DeviceOutOfMemory where the host has none to pin
    or the device cannot map it, naming `use`: (what it is for, what to do without it)."""
    what, remedy = use
    import cupy
    from cupy.cuda import pinned_memory, runtime

    size = max(nbytes, 1)
    try:
        mem = pinned_memory.PinnedMemory(size, runtime.hostAllocMapped | runtime.hostAllocPortable)
    except runtime.CUDARuntimeError as exc:
        raise DeviceOutOfMemory(
            f"{size:,} bytes of pinned host memory for {what} could not be "
            f"allocated ({exc}); {remedy}"
        ) from exc
    pointer = pinned_memory.PinnedMemoryPointer(mem, 0)
    device_ptr = runtime.pointerGetAttributes(pointer.ptr).devicePointer
    if not device_ptr:
        raise DeviceOutOfMemory(f"the GPU cannot map pinned host memory for {what}")
    host = np.frombuffer(pointer, np.uint8, size)
    owned = cupy.cuda.UnownedMemory(device_ptr, size, mem, cupy.cuda.Device().id)
    device = cupy.ndarray((size,), cupy.uint8, cupy.cuda.MemoryPointer(owned, 0))
    return host[:nbytes], device[:nbytes]


def carve(
    shapes: list[tuple[tuple[int, ...], Any]], use: tuple[str, str] = TABLE
) -> tuple[list[np.ndarray], list[Any]]:
    """One mapped block holding arrays of `shapes` [(shape, dtype)], each 256-aligned:
    their host views and their device arrays, in order."""
    sizes = [padded(int(np.prod(shape)) * np.dtype(dt).itemsize) for shape, dt in shapes]
    host, device = mapped(sum(sizes), use)
    hosts, devices, offset = [], [], 0
    for (shape, dt), size in zip(shapes, sizes, strict=True):
        n = int(np.prod(shape)) * np.dtype(dt).itemsize
        hosts.append(host[offset : offset + n].view(dt).reshape(shape))
        devices.append(device[offset : offset + n].view(dt).reshape(shape))
        offset += size
    return hosts, devices


def to_act(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values in the activation type's storage (bf16 as uint16 bits), rounded to
    nearest even as the device's conversions round."""
    if dtype == "bfloat16":
        return to_bf16(x)
    return np.asarray(x, np.float16 if dtype == "float16" else np.float32)


def host_table(checkpoint: Any, name: str, dtype: str) -> DWeight | QWeight:
    """Tensor `name` of `checkpoint` (an [rows, hidden] embedding table) in mapped pinned
    host memory, for activations of `dtype`, as the gather reads it."""
    info = checkpoint.tensors[name]
    V, H = (int(s) for s in info.shape)
    act = np.float32 if dtype == "float32" else np.float16 if dtype == "float16" else np.uint16
    q = info.quant
    if q is None:
        (table,), (device,) = carve([((V, H), act)])
        for r0 in range(0, V, ROWS_PER_READ):
            rows = slice(r0, min(V, r0 + ROWS_PER_READ))
            table[rows] = to_act(np.asarray(checkpoint.read(name, rows)), dtype)
        return DWeight(device, (V, H))
    groups = H // q.group_size
    shapes = [((V, H * q.bits // 32), np.uint32), ((V, groups), act), ((V, groups), act)]
    (codes, scales, biases), devices = carve(shapes)
    for r0 in range(0, V, ROWS_PER_READ):
        rows = slice(r0, min(V, r0 + ROWS_PER_READ))
        part = checkpoint.read(name, rows)
        n = rows.stop - rows.start
        codes[rows] = np.ascontiguousarray(part.packed).view(np.uint32).reshape(n, -1)
        scales[rows] = to_act(part.scales, dtype)
        biases[rows] = to_act(part.biases, dtype)
    return QWeight(*devices, q.bits, q.group_size, (V, H), blocked=False)
