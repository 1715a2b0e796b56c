"""NVRTC without a GPU: the version CuPy compiles with, and a compile for an explicit
architecture (what CI does for every card it has none of: tests/engine/test_nvrtc_archs.py).

`compile_module` calls the NVRTC library CuPy loads (found by cuda.pathfinder, which CuPy
14 uses too) through ctypes, which lets go of the GIL while NVRTC works: threads compile
modules in parallel. The options are the backend's own (`modules.options`) plus
`-arch=sm_XX`, so a module that compiles here is the module CuPy compiles on such a card.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from engine.backends.cuda.modules import options, source


class CompileError(Exception):
    """NVRTC refused a module; the message holds its log."""


def loaded_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library CuPy compiles the kernels with."""
    from cupy.cuda import nvrtc

    return tuple(nvrtc.getVersion())


def supported_archs() -> tuple[int, ...]:
    """The compute capabilities the loaded NVRTC compiles machine code for."""
    from cupy.cuda import nvrtc

    return tuple(int(a) for a in nvrtc.getSupportedArchs())


@functools.cache
def _library() -> Any:
    from cuda import pathfinder

    lib = ctypes.CDLL(pathfinder.load_nvidia_dynamic_lib("nvrtc").abs_path)
    lib.nvrtcCreateProgram.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.nvrtcAddNameExpression.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcCompileProgram.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_char_p),
    ]
    for name in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for name in ("nvrtcGetProgramLog", "nvrtcGetCUBIN"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    return lib


def compile_module(
    file: str, names: tuple[str, ...], dtype: str, arch: str, defines: tuple[str, ...] = ()
) -> bytes:
    """The cubin of `kernels/<file>` with name expressions `names` for activation dtype
    `dtype` and architecture `arch` ("sm_86"); CompileError with NVRTC's log if it fails."""
    nv = _library()
    prog = ctypes.c_void_p()
    if nv.nvrtcCreateProgram(
        ctypes.byref(prog), source(file).encode(), file.encode(), 0, None, None
    ):
        raise CompileError(f"{file}: nvrtcCreateProgram failed")
    try:
        for name in names:
            nv.nvrtcAddNameExpression(prog, name.encode())
        opts = [o.encode() for o in (*options(dtype, defines), f"-arch={arch}")]
        rc = nv.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if rc:
            size = ctypes.c_size_t()
            nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nv.nvrtcGetProgramLog(prog, log)
            raise CompileError(
                f"{file} ({dtype}, {arch}, {len(names)} instances) did not compile "
                f"(NVRTC error {rc}):\n{log.value.decode(errors='replace')}"
            )
        size = ctypes.c_size_t()
        nv.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetCUBIN(prog, cubin)
        return cubin.raw
    finally:
        nv.nvrtcDestroyProgram(ctypes.byref(prog))
