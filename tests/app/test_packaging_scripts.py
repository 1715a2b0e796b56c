"""Issue 28, items 7 and 8: packaging/snug.sh installs only when pyproject.toml changed and
checks the system libraries reliably; the tiny-checkpoint builder explains itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(path: Path, body: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def fake_checkout(tmp_path):
    """A copy of snug.sh in a checkout whose .venv, ldconfig and apt-get only log calls."""
    repo = tmp_path / "repo"
    (repo / "packaging").mkdir(parents=True)
    shutil.copy(ROOT / "packaging" / "snug.sh", repo / "packaging" / "snug.sh")
    (repo / "pyproject.toml").write_text('[project]\nname = "snug"\n')
    venv = repo / ".venv" / "bin"
    venv.mkdir(parents=True)
    log = tmp_path / "calls.log"
    _script(venv / "python", f'echo "python $*" >> {log}\n')
    _script(venv / "snug", f'echo "snug $*" >> {log}\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A long library list with the wanted one first: a reader that stops early kills it.
    _script(
        bin_dir / "ldconfig",
        'echo "libxcb-cursor.so.0 (libc6,x86-64) => /usr/lib/libxcb-cursor.so.0"\n'
        'yes "libfoo.so.1 (libc6,x86-64) => /usr/lib/libfoo.so.1" | head -n 100000\n',
    )
    _script(bin_dir / "apt-get", f'echo "apt-get $*" >> {log}\n')
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return repo, log, env


def _run(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(repo / "packaging" / "snug.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_snug_sh_installs_only_when_pyproject_changes(fake_checkout):
    repo, log, env = fake_checkout
    for _ in range(3):
        assert _run(repo, env, "--version").returncode == 0
    calls = log.read_text().splitlines()
    installs = [c for c in calls if "pip install" in c and "-e" in c]
    assert len(installs) == 1, calls
    assert calls.count("snug --version") == 3
    (repo / "pyproject.toml").write_text('[project]\nname = "snug"\nversion = "2"\n')
    _run(repo, env, "info")
    installs = [c for c in log.read_text().splitlines() if "pip install" in c and "-e" in c]
    assert len(installs) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="the library check runs as root only")
def test_snug_sh_library_check_never_misfires(fake_checkout):
    repo, log, env = fake_checkout
    for _ in range(10):
        assert _run(repo, env, "--version").returncode == 0
    assert not [c for c in log.read_text().splitlines() if c.startswith("apt-get")]


def test_tiny_builder_help_describes_the_presets():
    out = subprocess.run(
        [sys.executable, "-m", "engine.testing.tiny", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    from engine.testing.tiny import TINY_PRESETS

    for name in TINY_PRESETS:
        assert name in out
    assert "layers" in out and "mlx4-g64" in out


def test_tiny_builder_names_the_missing_package(tmp_path):
    # torch blocked as if the test extra were not installed
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from engine.testing.tiny import main\n"
        f"main([{str(tmp_path / 'out')!r}])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert "torch" in done.stderr and "bash tools/test.sh" in done.stderr
