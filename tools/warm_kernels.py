"""Compile the decode projection kernels into CuPy's disk cache, many at once (GPU only).

Each `gemv4` module (one per activation type, activation rows, SwiGLU and prologue) holds
every variant and takes NVRTC tens of seconds; a test run or benchmark on a bare lent machine
would compile them one after another. This compiles them in parallel processes first, into
the same cache ($CUPY_CACHE_DIR) the later runs read, so they start warm. `--define
SNUG_STAMPS` warms the modules `tools/profile_step.py --stamps` compiles with its clock
records.

    PYTHONPATH=. python3 tools/warm_kernels.py [--jobs 16] [--rows 1,2,3,8] [--define X]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

DTYPES = ("bfloat16", "float16")


def module_keys(dtypes, rows) -> list[tuple[str, int, bool, int]]:
    """(dtype, activation rows, swiglu, prologue kind) of every module to compile, the
    benchmarks' first (one row of bf16): prologue 0 none, 1 add + norm, and the gated norm
    as each type runs it (5 in bf16, 2 in fp16)."""
    keys = [
        (dt, r, sw, kind)
        for dt in dtypes
        for r in rows
        for sw in (True, False)
        for kind in (0, 1, 5 if dt == "bfloat16" else 2)
        if not (sw and kind not in (0, 1))  # SwiGLU follows only the add + norm
    ]
    return sorted(keys, key=lambda k: (k[1] != 1, k[0] != "bfloat16"))


def _compile(job: tuple) -> tuple:
    key, defines = job
    from engine.backends.cuda.launch import Kernels
    from engine.backends.cuda.projections import GEMV4_VARIANTS, Projections

    Projections.gemv4_defines = defines
    dtype, rows, swiglu, kind = key
    t = time.perf_counter()
    Projections(Kernels(dtype)).gemv4_kernel(rows, swiglu, GEMV4_VARIANTS[0], kind)
    return key, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--rows", default="1,2,3,8", help="activation rows (comma-separated)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--define", action="append", default=[], help="-D flag for gemv4.cu")
    args = ap.parse_args()
    keys = module_keys(args.dtypes.split(","), [int(r) for r in args.rows.split(",")])
    t = time.perf_counter()
    jobs = [(k, tuple(args.define)) for k in keys]
    with ProcessPoolExecutor(args.jobs) as ex:
        for key, s in ex.map(_compile, jobs):
            print(f"gemv4 {key}: {s:.1f} s", flush=True)
    print(f"{len(keys)} modules in {time.perf_counter() - t:.1f} s ({args.jobs} processes)")


if __name__ == "__main__":
    main()
