"""The tree a measurement ran on, for its receipt (the tools' benchmarks: JSON and tables).
Here, not in tools/, so a tool run as a script imports it with the engine package."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def commit(given: str | None = None) -> str:
    """`given` where it names a commit (a lent machine's copy of the tree may carry an older
    .git, so the device scripts pass COMMIT), else git's short HEAD here, else "unknown"."""
    if given and given != "unknown":
        return given
    try:
        got = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        )
    except OSError:
        return "unknown"
    return got.stdout.strip() or "unknown"
