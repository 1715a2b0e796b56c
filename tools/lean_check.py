"""Fail when any tracked or new Python source file is longer than the limit (600 lines)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIMIT = 600


def python_files(root: Path) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode == 0:
        return [root / line for line in listed.stdout.splitlines() if line]
    return [p for p in root.rglob("*.py") if ".venv" not in p.parts]


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    too_long = []
    for path in python_files(root):
        if not path.is_file():
            continue
        lines = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
        if lines > LIMIT:
            too_long.append((lines, path.relative_to(root)))
    for lines, path in sorted(too_long, reverse=True):
        print(f"{path}: {lines} lines (limit {LIMIT}); split it by concept")
    if too_long:
        return 1
    print(f"lean check: every Python file is at most {LIMIT} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
