"""Build Snug's self-contained Linux bundle (one folder) with PyInstaller.

    bash packaging/build.sh [--no-cuda] [--dist DIR]

(`bash packaging/build.sh` runs this file as a script: a module named `packaging` would
shadow the `packaging` library that pip and PyInstaller import.) The bundle lands in
DIR/snug/ (default dist/snug/): run DIR/snug/snug. It holds Python, PySide6, the app's
resources, the engine's .cu/.cuh kernels and, when CuPy is installed here and --no-cuda is
not given, CuPy with the CUDA libraries of the NVIDIA wheels. Needs the `bundle` extra:
`pip install -e '.[bundle]'`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cuda", action="store_true", help="leave CuPy and CUDA out")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "pyinstaller")
    args = parser.parse_args(argv)
    try:
        import PyInstaller.__main__ as pyinstaller
    except ImportError:
        sys.stderr.write(
            "build.py: PyInstaller is not installed; run `.venv/bin/pip install -e '.[bundle]'`\n"
        )
        return 2
    # CuPy goes in only when installed here (the spec reads the same variable).
    cuda = not args.no_cuda and importlib.util.find_spec("cupy") is not None
    os.environ["SNUG_BUNDLE_CUDA"] = "1" if cuda else "0"
    start = time.monotonic()
    pyinstaller.run(
        [
            str(ROOT / "packaging" / "snug.spec"),
            "--noconfirm",
            "--log-level=WARN",
            f"--distpath={args.dist}",
            f"--workpath={args.work}",
        ]
    )
    out = args.dist / "snug"
    size = folder_bytes(out) / (1 << 20)
    sys.stdout.write(
        f"built {out / 'snug'} in {time.monotonic() - start:.0f} s: {size:.0f} MiB "
        f"({'with' if cuda else 'without'} CuPy)\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
