"""The kernels without running them: compile them ahead, or read their machine code.

    PYTHONPATH=. python3 tools/compile_kernels.py warm [--jobs 16] [--rows 1,2,3,8] [--define X]
    PYTHONPATH=. python tools/compile_kernels.py sass gemv4.cu 'gemv4<1,true,2,8,false,768,1,false>'

`warm` (GPU only) compiles the decode projection kernels into CuPy's disk cache in parallel
processes. Each `gemv4` module (one per activation type, activation rows, SwiGLU and
prologue) holds every variant and takes NVRTC tens of seconds; a test run or benchmark on a
bare lent machine would compile them one after another, so `tools/device_check.sh` and
`tools/device_ab.sh` warm the cache ($CUPY_CACHE_DIR) first. `--define SNUG_STAMPS` warms
the modules `tools/profile_step.py --stamps` compiles with its clock records.

`sass` (no GPU) compiles a kernel file as the engine does and prints its machine code.
Decode kernels here are bound by latency: a load whose result is used before the next load
is issued costs a whole round trip to memory, and the order the compiler emits shows that.
NVRTC compiles `engine/backends/cuda/kernels/<file>` (its headers inlined, as
`modules.source` hands it to CuPy) for an architecture, and `cuobjdump -sass` disassembles
the cubin. With --summary only the instructions that matter for latency are kept (global
loads and stores, atomics, barriers, fences, the wait for the previous kernel: ACQBULK).
Needs the NVRTC library and cuobjdump/nvdisasm, none of which the app uses:

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

from engine.backends.cuda.modules import ACT_KINDS, source

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


KEEP = re.compile(r"Function :|LDG|STG|LDGSTS|ATOM|RED\.|BAR|MEMBAR|FENCE|ACQBULK|PREEXIT|UCGABAR")


def _find(pattern: str) -> str | None:
    """A file of an installed nvidia-* wheel (site-packages/nvidia/...)."""
    root = os.path.join(sysconfig.get_paths()["purelib"], "nvidia")
    hits = glob.glob(os.path.join(root, "**", pattern), recursive=True)
    return sorted(hits)[-1] if hits else None


def compile_cubin(file: str, names: list[str], act: str, arch: str) -> bytes:
    lib = _find("libnvrtc.so.*[0-9]")
    if lib is None:
        raise SystemExit("no NVRTC library: pip install nvidia-cuda-nvrtc-cu12")
    nv = ctypes.CDLL(lib)
    prog = ctypes.c_void_p()
    src = source(file).encode()
    if nv.nvrtcCreateProgram(ctypes.byref(prog), src, file.encode(), 0, None, None):
        raise SystemExit("nvrtcCreateProgram failed")
    for name in names:
        nv.nvrtcAddNameExpression(prog, name.encode())
    opts = [b"-std=c++17", f"-DACT_KIND={ACT_KINDS[act]}".encode(), f"-arch={arch}".encode()]
    rc = nv.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    if rc:
        raise SystemExit(f"{file} ({act}, {arch}) did not compile:\n{log.value.decode()}")
    nv.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw


def disassemble(cubin: bytes) -> str:
    tool = shutil.which("cuobjdump") or _find("cuobjdump")
    nvdisasm = shutil.which("nvdisasm") or _find("nvdisasm")
    if tool is None or nvdisasm is None:
        raise SystemExit(
            "no cuobjdump/nvdisasm: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
        )
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ["PATH"])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr)
    return done.stdout


def _tidy(line: str) -> str:
    """'/*0640*/  LDG.E.128 R8, [R8.64] ;  /* 0x... */' -> '0640 LDG.E.128 R8, [R8.64] ;'."""
    m = re.match(r"\s*/\*([0-9a-f]+)\*/\s*(.*?)\s*/\*", line)
    return f"{m.group(1)} {m.group(2)}" if m else line.strip()


def warm(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="compile_kernels.py warm")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--rows", default="1,2,3,8", help="activation rows (comma-separated)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--define", action="append", default=[], help="-D flag for gemv4.cu")
    args = ap.parse_args(argv)
    keys = module_keys(args.dtypes.split(","), [int(r) for r in args.rows.split(",")])
    t = time.perf_counter()
    jobs = [(k, tuple(args.define)) for k in keys]
    with ProcessPoolExecutor(args.jobs) as ex:
        for key, s in ex.map(_compile, jobs):
            print(f"gemv4 {key}: {s:.1f} s", flush=True)
    print(f"{len(keys)} modules in {time.perf_counter() - t:.1f} s ({args.jobs} processes)")


def sass(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="compile_kernels.py sass")
    ap.add_argument("file", help="a file of engine/backends/cuda/kernels, e.g. attention.cu")
    ap.add_argument("names", nargs="+", help="kernels (template instances spelled out)")
    ap.add_argument("--act", default="bfloat16", choices=sorted(ACT_KINDS))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--summary", action="store_true", help="loads, stores, barriers only")
    args = ap.parse_args(argv)
    sass = disassemble(compile_cubin(args.file, args.names, args.act, args.arch))
    bases = [n.split("<")[0] for n in args.names]
    shown = False  # the file's other kernels (extern "C" ones are always compiled) left out
    for line in sass.splitlines():
        if "Function :" in line:
            shown = any(b in line for b in bases)
        if shown and line.strip() and (not args.summary or KEEP.search(line)):
            print(_tidy(line))


def main() -> None:
    import sys

    commands = {"warm": warm, "sass": sass}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: compile_kernels.py {{{'|'.join(commands)}}} ...\n\n{__doc__}")
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
