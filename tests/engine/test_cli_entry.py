"""`snug` itself (app/entry.py) used from a terminal and from scripts: its own flags on a
closed pipe, Ctrl+C while the command line loads, and `--smoke` without its folder."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from app.entry import main

ROOT = Path(__file__).resolve().parents[2]


def run_closed_stdout(*args: str) -> subprocess.CompletedProcess:
    """`snug ARGS` with its output piped into a reader that has already gone (`| head -0`)."""
    read, write = os.pipe()
    os.close(read)
    code = f"import sys; from app.entry import main; sys.exit(main({list(args)!r}))"
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_into_a_closed_pipe_end_quietly(flag):
    done = run_closed_stdout(flag)
    assert done.stderr == ""  # no BrokenPipeError traceback
    assert done.returncode == 0


class Interrupted(types.ModuleType):
    """engine.cli as it is while Ctrl+C arrives during its imports."""

    def __getattr__(self, name):
        if name == "main":
            raise KeyboardInterrupt
        raise AttributeError(name)


def test_ctrl_c_while_the_command_line_loads_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "engine.cli", Interrupted("engine.cli"))
    assert main(["generate", "--model", "m", "--prompt", "hi"]) == 130
    assert capsys.readouterr().err == "\nsnug: interrupted\n"


@pytest.mark.parametrize(
    "args", [["--smoke"], ["--smoke", "--screenshot", "shot.png"], ["--smoke", "m", "--screenshot"]]
)
def test_smoke_without_its_folder_is_refused_before_the_window_opens(args, monkeypatch, capsys):
    opened = []
    gui = types.ModuleType("app.main")
    gui.main = lambda argv: opened.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "app.main", gui)
    assert main(args) == 2
    assert opened == []
    err = capsys.readouterr().err
    assert err.startswith("snug: --smoke") or err.startswith("snug: --screenshot")
    assert "snug --smoke DIR [--screenshot PNG]" in err
    assert err.count("\n") == 1
