"""Lazy compilation of the `.cu` sources into CuPy RawModules, one per (file, dtype, symbol).

A source is read once, `common.cuh` is inlined, and each kernel symbol (a plain name or a
template instance such as `gemv<4,1,2,false>`) is compiled on first use with
`-DACT_KIND=<dtype>`. CuPy keeps compiled binaries in its cache directory (CUPY_CACHE_DIR),
so later runs load instead of compiling.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

KERNEL_DIR = Path(__file__).parent / "kernels"
ACT_KINDS = {"float32": 0, "float16": 1, "bfloat16": 2}


def use_cache_dir(cache_dir: str | None) -> None:
    """Point CuPy's kernel cache under Snug's cache folder unless the user chose one."""
    if cache_dir:
        os.environ.setdefault("CUPY_CACHE_DIR", str(Path(cache_dir) / "cupy-kernels"))


@functools.cache
def _source(name: str) -> str:
    common = (KERNEL_DIR / "common.cuh").read_text()
    text = (KERNEL_DIR / name).read_text()
    return text.replace('#include "common.cuh"', common.replace("#pragma once", ""))


@functools.cache
def function(file: str, symbol: str, dtype: str) -> Any:
    """The compiled kernel `symbol` of `kernels/<file>` for activation dtype `dtype`."""
    import cupy

    options = ("-std=c++17", f"-DACT_KIND={ACT_KINDS[dtype]}")
    if "<" in symbol:
        module = cupy.RawModule(code=_source(file), options=options, name_expressions=[symbol])
    else:
        module = cupy.RawModule(code=_source(file), options=options)
    return module.get_function(symbol)
