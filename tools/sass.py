"""Compile a kernel file as the engine does and print its machine code, without a GPU.

Decode kernels here are bound by latency: a load whose result is used before the next load
is issued costs a whole round trip to memory. The order the compiler actually emits shows
that, and this prints it: NVRTC compiles `engine/backends/cuda/kernels/<file>` (its headers
inlined, as `modules.source` hands it to CuPy) for an architecture, and `cuobjdump -sass`
disassembles the cubin. With --summary only the instructions that matter for latency are
kept (global loads and stores, atomics, barriers, fences, the wait for the previous kernel:
ACQBULK). Needs the NVRTC library and cuobjdump/nvdisasm, none of which the app uses:

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
    PYTHONPATH=. python tools/sass.py gemv4.cu 'gemv4<1,true,2,8,false,768,1,false>' --summary
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

from engine.backends.cuda.modules import ACT_KINDS, source

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="a file of engine/backends/cuda/kernels, e.g. attention.cu")
    ap.add_argument("names", nargs="+", help="kernels (template instances spelled out)")
    ap.add_argument("--act", default="bfloat16", choices=sorted(ACT_KINDS))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--summary", action="store_true", help="loads, stores, barriers only")
    args = ap.parse_args()
    sass = disassemble(compile_cubin(args.file, args.names, args.act, args.arch))
    bases = [n.split("<")[0] for n in args.names]
    shown = False  # the file's other kernels (extern "C" ones are always compiled) left out
    for line in sass.splitlines():
        if "Function :" in line:
            shown = any(b in line for b in bases)
        if shown and line.strip() and (not args.summary or KEEP.search(line)):
            print(_tidy(line))


def _tidy(line: str) -> str:
    """'/*0640*/  LDG.E.128 R8, [R8.64] ;  /* 0x... */' -> '0640 LDG.E.128 R8, [R8.64] ;'."""
    m = re.match(r"\s*/\*([0-9a-f]+)\*/\s*(.*?)\s*/\*", line)
    return f"{m.group(1)} {m.group(2)}" if m else line.strip()


if __name__ == "__main__":
    main()
