"""Kernel launches: `Kernels`, through which every kernel family compiles and launches; the
device properties that launch geometry reads (compute capability, SM count, L2 bytes, shared
memory per block, each asked once a device: `card()`; `simulate` reads the last three as
another card's, SNUG_DEVICE_PROPS); and programmatic dependent launch
(PDL) where `card.runs_pdl` allows it (compute capability 9.0 and newer).

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

from engine.backends.cuda.card import Card, runs_bulk_prefetch, runs_pdl
from engine.backends.cuda.modules import function
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.weights import QWeight

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


_CAPABILITY: dict[int, int] = {}
_PROPERTIES: dict[int, dict] = {}
# Properties read as another card's (`simulate`): cudaDeviceProp key -> value.
_SIMULATED: dict[str, int] = {}
_PROPERTY_KEYS = {
    "sm_count": "multiProcessorCount",
    "l2_bytes": "l2CacheSize",
    "smem_per_block": "sharedMemPerBlockOptin",
}


def compute_capability() -> int:
    """The current device's compute capability, major * 10 + minor (asked once a device)."""
    import cupy

    dev = cupy.cuda.Device()
    if dev.id not in _CAPABILITY:
        _CAPABILITY[dev.id] = int(dev.compute_capability)
    return _CAPABILITY[dev.id]


def _properties() -> dict:
    """The current device's properties (cudaGetDeviceProperties, asked once a device), with
    those `simulate` set in place of its own."""
    import cupy

    dev = cupy.cuda.Device()
    if dev.id not in _PROPERTIES:
        _PROPERTIES[dev.id] = {**cupy.cuda.runtime.getDeviceProperties(dev.id), **_SIMULATED}
    return _PROPERTIES[dev.id]


def simulate(props: dict[str, int]) -> None:
    """From now on, read the SM count, L2 bytes and opt-in shared memory a block of every
    device as `props` says (keys: "sm_count", "l2_bytes", "smem_per_block", as
    `engine.config.parse_device_props` gives them from SNUG_DEVICE_PROPS; empty: the
    device's own). For tests and measurements only: the kernels still run on the real GPU,
    with the grids, chunk sizes, kernel variants and L2 spans chosen for the card named
    (a 20-SM, 2 MiB L2, 99 KiB card on a large one: tests/device/test_small_card_props.py).
    The compute capability, and with it every architecture gate, stays the device's."""
    chosen = {_PROPERTY_KEYS[name]: int(value) for name, value in props.items()}
    if chosen != _SIMULATED:
        _SIMULATED.clear()
        _SIMULATED.update(chosen)
        _PROPERTIES.clear()  # asked again, with the new values in place


def sm_count() -> int:
    """The current device's number of streaming multiprocessors (132 on an H200)."""
    return int(_properties()["multiProcessorCount"])


def l2_bytes() -> int:
    """The current device's L2 cache bytes (60 MB on an H200)."""
    return int(_properties()["l2CacheSize"])


def smem_per_block() -> int:
    """Shared memory bytes one block may opt in to (227 KiB on an H200)."""
    return int(_properties()["sharedMemPerBlockOptin"])


def card() -> Card:
    """The current device as the backend's choices read it (catalog.py, support.py)."""
    return Card(compute_capability(), sm_count(), l2_bytes(), smem_per_block())


def cdiv(a: int, b: int) -> int:
    """`a / b` rounded up."""
    return -(-a // b)


def grid_cap() -> int:
    """Blocks of a grid-stride kernel (conversions, swiglu, the SIMT gemv): 16 an SM."""
    return 16 * sm_count()


def pdl_available() -> bool:
    """True where the card runs PDL (`card.runs_pdl`) and the driver has `cuLaunchKernelEx`."""
    return runs_pdl(compute_capability()) and _driver_launch() is not None


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


def ahead_spans(ahead: tuple, tuning: Tuning) -> tuple:
    """The three (pointer, bytes) pairs of a decode launch that brings the weights read next
    toward L2 while it leaves memory idle (gdn_step, attn_prep: `prefetch_ahead` in
    common.cuh): all of the first (out_proj or o_proj), the first `l2_mlp_fraction` of the
    next two's codes (the MLP's gate and up), each at most `l2_span_share` of the card's L2;
    null where a weight is missing or not quantized."""
    out: tuple = ()
    cap = None
    for i in range(3):
        w = ahead[i] if i < len(ahead) else None
        if not isinstance(w, QWeight):
            out += byte_span(None)
            continue
        if cap is None:
            cap = int(l2_bytes() * tuning.l2_span_share) & ~15
        if i == 0:
            ptr, n = byte_span(w)
        else:
            ptr = np.uint64(w.packed.data.ptr)
            n = int(w.packed.nbytes * tuning.l2_mlp_fraction) & ~15
        out += (ptr, np.int64(min(int(n), cap)))
    return out


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


class Kernels:
    """Compiles and launches the kernels of one activation dtype ('bfloat16', 'float16' or
    'float32'); every kernel family launches through one of these.

    Half-precision arrays are CuPy float16, bf16 arrays are stored as uint16. Launches made
    while a decode graph is captured (`graphing`) use programmatic dependent launch where the
    GPU and driver have it and the settings allow it (`pdl`); eager launches go through
    CuPy, whose launch path costs less host time. `prefetch`: the decode step's launches
    bring the weights read next toward L2 (`card.runs_bulk_prefetch`). `catalog`, set at
    load (catalog.instances), holds every (file, symbol) the backend may request for the
    model: a request outside it is a bug in the catalog, which CI compiles for each
    architecture (tests/engine/test_nvrtc_archs.py).
    """

    def __init__(self, dtype: str, overlap: bool = True) -> None:
        import cupy

        from engine.backends.cuda import blas

        if dtype not in blas.TYPES:
            raise ValueError(f"dtype {dtype!r}: choose bfloat16, float16 or float32")
        self.dtype = dtype
        self.act_dtype = {
            "float32": cupy.float32,
            "float16": cupy.float16,
            "bfloat16": cupy.uint16,
        }[dtype]
        self.act_itemsize = 4 if dtype == "float32" else 2
        self.cuda_type = blas.TYPES[dtype]  # the activation type as cuBLAS names it
        self.pdl = overlap and pdl_available()
        self.prefetch = runs_bulk_prefetch(compute_capability())
        self.graphing = False  # a decode graph is being captured
        self.catalog: frozenset[tuple[str, str]] | None = None
        self._smem_set: dict[tuple, int] = {}

    def check(self, file: str, symbols: list[str]) -> None:
        """Every one of `symbols` of `kernels/<file>` is in the catalog (where one is set)."""
        if self.catalog is not None:
            missing = [s for s in symbols if (file, s) not in self.catalog]
            assert not missing, f"{file}: {missing} not in catalog.instances"

    def fn(self, file: str, symbol: str) -> Any:
        """The compiled kernel `symbol` of `kernels/<file>` for this dtype."""
        if self.catalog is not None and (file, symbol) not in self.catalog:
            self.check(file, [symbol])
        return function(file, symbol, self.dtype)

    def launch(self, fn: Any, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        """Every kernel goes through here: with PDL its start overlaps the previous one's end."""
        if self.pdl and self.graphing:
            launch_pdl(fn, grid, block, args, shared_mem)
        else:
            fn(grid, block, args, shared_mem=shared_mem)

    def run(self, file: str, symbol: str, grid: tuple, block: tuple, args: tuple, smem: int = 0):
        """Launch kernel `symbol` of `kernels/<file>`."""
        self.launch(self.fn(file, symbol), grid, block, args, smem)

    def allow_smem(self, fn: Any, key: tuple, smem: int) -> None:
        """Let kernel `fn` (cached under `key`) take `smem` bytes of dynamic shared memory,
        set once per size. The 48 KiB default counts static shared memory too, so sizes
        above 40 KiB ask for it explicitly."""
        if smem > 40 * 1024 and self._smem_set.get(key, 0) < smem:
            fn.max_dynamic_shared_size_bytes = smem
            self._smem_set[key] = smem
