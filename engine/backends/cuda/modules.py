"""Lazy compilation of the `.cu` sources into CuPy RawModules, one per (file, dtype, symbol).

A source is read once, its local headers (`common.cuh`, ...) are inlined, and each kernel
symbol (a plain name or a template instance such as `gemv<4,1,2,false>`) is compiled on
first use with `-DACT_KIND=<dtype>`. CuPy keeps compiled binaries in its cache directory
(CUPY_CACHE_DIR), so later runs load instead of compiling.

`built()` counts the modules made in this process, compiled or loaded from that cache:
warm-up makes every one a request uses, so a request makes none (invariant 4;
tests/device/test_warmup.py reads it around a fresh engine's first requests).
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

KERNEL_DIR = Path(__file__).parent / "kernels"
ACT_KINDS = {"float32": 0, "float16": 1, "bfloat16": 2}
_BUILT = [0]  # modules made so far (`built`)


def built() -> int:
    """Modules of `kernels/` made in this process so far: each NVRTC compile, or load from
    CuPy's cache on disk, of a kernel (`function`) or of a module of instances (`module`)."""
    return _BUILT[0]


def use_cache_dir(cache_dir: str | None) -> None:
    """Point CuPy's kernel cache under Snug's cache folder unless the user chose one."""
    if cache_dir:
        os.environ.setdefault("CUPY_CACHE_DIR", str(Path(cache_dir) / "cupy-kernels"))


@functools.cache
def source(name: str) -> str:
    """The text of `kernels/<name>` with its local `#include "x.cuh"` lines inlined, each
    header once (NVRTC is given one string, not a directory)."""
    seen: set[str] = set()

    def inline(match: re.Match) -> str:
        header = match.group(1)
        if header in seen:
            return ""
        seen.add(header)
        return _INCLUDE.sub(inline, (KERNEL_DIR / header).read_text().replace("#pragma once", ""))

    return _INCLUDE.sub(inline, (KERNEL_DIR / name).read_text())


_INCLUDE = re.compile(r'^#include "([\w.]+\.cuh)"$', re.M)


def options(dtype: str, defines: tuple[str, ...] = ()) -> tuple[str, ...]:
    """NVRTC options of every kernel file for activation dtype `dtype` (CuPy adds the
    device's architecture; nvrtc.compile an explicit one)."""
    return ("-std=c++17", f"-DACT_KIND={ACT_KINDS[dtype]}", *(f"-D{d}" for d in defines))


@functools.cache
def function(file: str, symbol: str, dtype: str) -> Any:
    """The compiled kernel `symbol` of `kernels/<file>` for activation dtype `dtype`."""
    import cupy

    opts = options(dtype)
    _BUILT[0] += 1
    if "<" in symbol:
        module = cupy.RawModule(code=source(file), options=opts, name_expressions=[symbol])
    else:
        module = cupy.RawModule(code=source(file), options=opts)
    return module.get_function(symbol)


def module(file: str, dtype: str, names: list[str], defines: tuple[str, ...] = ()) -> Any:
    """One module of `kernels/<file>` holding the template instances `names` (one compile
    for many), with extra `-D` flags `defines`."""
    import cupy

    opts = options(dtype, defines)
    _BUILT[0] += 1
    return cupy.RawModule(code=source(file), options=opts, name_expressions=names)
