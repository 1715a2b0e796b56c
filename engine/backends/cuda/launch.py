"""Kernel launches with programmatic dependent launch (PDL) on Hopper and newer.

A decode step is a chain of about two hundred short kernels. Launched normally, each one
starts only after the previous one has finished and its writes are flushed, so every
boundary costs an idle gap plus the ramp-up of the next kernel's memory traffic. With the
launch attribute `programmaticStreamSerializationAllowed`, the next kernel's blocks may start
while the previous kernel is still running: every kernel in `kernels/` first issues what does
not depend on earlier kernels (a projection's weight loads), then waits at
`griddepcontrol.wait` (`pdl_wait()` in common.cuh) until the previous grid has completed and
its memory is visible, and only then reads activations or writes anything. The wait is a
no-op for a kernel launched without the attribute, so the same binaries serve both paths.

CuPy launches through `cuLaunchKernel`, which has no attributes, so this module calls the
driver's `cuLaunchKernelEx` through ctypes with the CUfunction CuPy compiled. Launches made
while a stream is being captured keep the attribute as a programmatic edge in the graph.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[Any]:
    """Make `stream` CuPy's current stream inside the block, then restore the one that was
    current before it. (CuPy's own `with stream:` restores the stream below it on CuPy's
    stack, which `Stream.use()` does not push to: after it, the legacy default stream would
    be current, and later kernels would race with work on the backend's non-blocking stream.)
    """
    import cupy

    before = cupy.cuda.get_current_stream()
    stream.use()
    try:
        yield stream
    finally:
        before.use()


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("smem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)),
        ("n_attrs", ctypes.c_uint),
    ]


_SCALARS = {
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
}


@functools.cache
def driver_function(name: str) -> Any:
    """Entry point `name` of the CUDA driver library (ctypes), or None where the library or
    the entry point does not exist. The caller sets its argument types."""
    for lib_name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(lib_name)
        except OSError:
            continue
        return getattr(lib, name, None)
    return None


@functools.cache
def _driver_launch() -> Any:
    """`cuLaunchKernelEx` from the driver library, or None where it does not exist."""
    fn = driver_function("cuLaunchKernelEx")
    if fn is not None:
        fn.restype = ctypes.c_int
        fn.argtypes = [
            ctypes.POINTER(_Config),
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
        ]
    return fn


_SMS: dict[int, int] = {}
_CAPABILITY: dict[int, int] = {}


def compute_capability() -> int:
    """The current device's compute capability, major * 10 + minor (asked once a device)."""
    import cupy

    dev = cupy.cuda.Device()
    if dev.id not in _CAPABILITY:
        _CAPABILITY[dev.id] = int(dev.compute_capability)
    return _CAPABILITY[dev.id]


def sm_count() -> int:
    """The current device's number of streaming multiprocessors (asked once a device)."""
    import cupy

    dev = cupy.cuda.Device()
    if dev.id not in _SMS:
        _SMS[dev.id] = int(cupy.cuda.runtime.getDeviceProperties(dev.id)["multiProcessorCount"])
    return _SMS[dev.id]


def pdl_available() -> bool:
    """True on a compute capability 9.0+ device whose driver has `cuLaunchKernelEx`."""
    return compute_capability() >= 90 and _driver_launch() is not None


def or_null(a: Any) -> Any:
    """A kernel argument for an optional array: the array, or a null pointer."""
    return np.uint64(0) if a is None else a


def byte_span(w: Any) -> tuple:
    """(pointer, bytes) kernel arguments for the device memory that a quantized weight's
    codes, scales and biases span (carved one after another from the arena); null: none."""
    if w is None:
        return (or_null(None), np.int64(0))
    parts = (w.packed, w.scales, w.biases)
    lo = min(int(a.data.ptr) for a in parts)
    hi = max(int(a.data.ptr) + a.nbytes for a in parts)
    return (np.uint64(lo), np.int64((hi - lo) & ~15))


def _param(arg: Any) -> Any:
    import cupy

    if isinstance(arg, cupy.ndarray):
        return ctypes.c_void_p(arg.data.ptr)
    if isinstance(arg, bytes):  # a struct passed by value (a tensor map)
        return (ctypes.c_char * len(arg)).from_buffer_copy(arg)
    ctype = _SCALARS.get(arg.dtype) if isinstance(arg, np.generic) else None
    if ctype is None:
        raise TypeError(f"kernel argument {arg!r}: pass a CuPy array or a sized numpy scalar")
    return ctype(arg)


def _dim3(v: tuple[int, ...]) -> Any:
    return (ctypes.c_uint * 3)(*(tuple(int(x) for x in v) + (1, 1, 1))[:3])


def launch_pdl(
    fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, pdl: bool = True
) -> None:
    """Launch CuPy kernel `fn` on the current stream with programmatic serialization (or,
    with `pdl` False, plainly: the path for kernels that take structs by value)."""
    import cupy

    params = [_param(a) for a in args]
    ptrs = (ctypes.c_void_p * max(1, len(params)))(
        *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params]
    )
    attr = _Attr(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    cfg = _Config(
        grid=_dim3(grid),
        block=_dim3(block),
        smem=int(shared_mem),
        stream=cupy.cuda.get_current_stream().ptr,
        attrs=ctypes.pointer(attr),
        n_attrs=1 if pdl else 0,
    )
    handle = fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr  # RawKernel or Function
    rc = _driver_launch()(ctypes.byref(cfg), handle, ptrs, None)
    if rc != 0:
        raise RuntimeError(
            f"cuLaunchKernelEx failed with CUresult {rc} (grid {grid}, block {block})"
        )
