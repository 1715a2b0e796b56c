"""A script run as `python3 tools/x.py` has tools/ first on its import path, so a tool named
like a package that a library imports or probes for is found in that package's place:
transformers 5.25 imports `kernels` (the Hugging Face kernel hub) wherever a module of that
name is importable, and a tool once called kernels.py broke every tool that loads
transformers. No file in a folder whose scripts run that way (tools/, and packaging/, which
runs PyInstaller in-process) may take such a name."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import transformers.utils.import_utils as import_utils

REPO = Path(__file__).resolve().parents[2]
SCRIPT_DIRS = (REPO / "tools", REPO / "packaging")


def _probed() -> set[str]:
    """Top-level names transformers asks the import system for (`_is_package_available`)."""
    src = Path(import_utils.__file__).read_text()
    names = re.findall(r'_is_package_available\(\s*"([A-Za-z0-9_.]+)"', src)
    return {n.split(".")[0] for n in names}


def test_the_probe_list_is_read():
    # the pattern still matches what transformers writes: these two it has always probed
    assert {"torch", "accelerate"} <= _probed()


def test_no_tool_is_named_like_a_package_a_library_imports():
    taken = _probed() | set(importlib.metadata.packages_distributions())
    for folder in SCRIPT_DIRS:
        stems = {p.stem for p in folder.glob("*.py")}
        assert stems, folder
        assert not stems & taken, f"rename these in {folder.name}/: {sorted(stems & taken)}"
