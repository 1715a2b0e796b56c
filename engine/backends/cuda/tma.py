"""Tensor maps for the copy engine (TMA, compute capability 9.0+), made by the driver's
`cuTensorMapEncodeTiled` through ctypes and passed to kernels by value.

The streamed projection kernel (kernels/gemv4s.cu) copies a tile's 4-bit codes with one
tensor copy per 8 rows. Its map views a `[out, in/8]` uint32 code matrix as three dimensions:
32 words (one 128-byte column block) x rows x column blocks, with a box of 32 x 8 x in/256 and
the 128-byte swizzle, so a box lands in shared memory as [block][row][128 bytes] with 16-byte
chunk c of row r at chunk c ^ r (what keeps the kernel's reads free of bank conflicts).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from engine.backends.cuda.launch import driver_function

_UINT32 = 2  # CUtensorMapDataType
_SWIZZLE_128B = 3  # CUtensorMapSwizzle
_L2_256B = 3  # CUtensorMapL2promotion


@functools.cache
def _encode() -> Any:
    fn = driver_function("cuTensorMapEncodeTiled")
    if fn is not None:
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        fn.restype = ctypes.c_int
        fn.argtypes = [
            ctypes.c_void_p,  # CUtensorMap*
            ctypes.c_int,  # data type
            ctypes.c_uint32,  # rank
            ctypes.c_void_p,  # global address
            u64p,  # global dims
            u64p,  # global strides (bytes), rank - 1 of them
            u32p,  # box dims
            u32p,  # element strides
            ctypes.c_int,  # interleave
            ctypes.c_int,  # swizzle
            ctypes.c_int,  # L2 promotion
            ctypes.c_int,  # out-of-bounds fill
        ]
    return fn


def available() -> bool:
    return _encode() is not None


def code_map(ptr: int, rows: int, cols: int) -> bytes:
    """The 128-byte tensor map of a `[rows, cols/8]` uint32 4-bit code matrix at device
    address `ptr` (16-byte aligned, cols % 256 == 0), with a box of 8 rows."""
    if cols % 256 or ptr % 16:
        raise ValueError(
            f"code matrix {rows}x{cols} at {ptr:#x}: needs cols % 256 == 0, 16-byte alignment"
        )
    fn = _encode()
    if fn is None:
        raise RuntimeError("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12)")
    out = (ctypes.c_ubyte * 128)()
    dims = (ctypes.c_uint64 * 3)(32, rows, cols // 256)
    strides = (ctypes.c_uint64 * 2)(cols // 2, 128)
    box = (ctypes.c_uint32 * 3)(32, 8, cols // 256)
    ones = (ctypes.c_uint32 * 3)(1, 1, 1)
    swz, l2 = _SWIZZLE_128B, _L2_256B
    rc = fn(ctypes.addressof(out), _UINT32, 3, ptr, dims, strides, box, ones, 0, swz, l2, 0)
    if rc != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled: CUresult {rc} for {rows}x{cols} codes")
    return bytes(out)
