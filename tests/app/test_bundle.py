"""The bundle: the applications-menu offer (asked once), and, with SNUG_BUNDLE_TEST=1, a
build of the one-folder bundle that starts under Xvfb, loads a tiny model and answers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from tests.app.helpers import answer_next_dialog

ROOT = Path(__file__).resolve().parents[2]


def test_the_menu_entry_is_offered_once_and_points_at_the_bundle(qtbot, tmp_path):
    from app import desktop_entry

    store = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    exe = tmp_path / "Snug" / "snug"
    apps = tmp_path / "applications"
    seen: list[str] = []
    answer_next_dialog("Add to menu", seen)
    path = desktop_entry.offer(None, store, exe=exe, apps_dir=apps)
    assert path == apps / "snug.desktop" and any("applications menu" in t for t in seen)
    text = path.read_text()
    assert f'Exec="{exe}"' in text and "Icon=/" in text and "Name=Snug" in text
    # Asked once: the second start says nothing and writes nothing.
    path.unlink()
    assert desktop_entry.offer(None, store, exe=exe, apps_dir=apps) is None
    assert not path.exists()


def test_a_no_is_remembered_too(qtbot, tmp_path):
    from app import desktop_entry

    store = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    seen: list[str] = []
    answer_next_dialog("No, thanks", seen)
    apps = tmp_path / "applications"
    assert desktop_entry.offer(None, store, exe=tmp_path / "snug", apps_dir=apps) is None
    assert seen and desktop_entry.was_asked(store) and not apps.exists()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SNUG_BUNDLE_TEST") != "1", reason="set SNUG_BUNDLE_TEST=1")
def test_the_bundle_starts_and_answers_under_xvfb(tmp_path, tiny_checkpoint):
    if shutil.which("xvfb-run") is None:
        pytest.skip("xvfb-run is not installed (apt-get install -y xvfb)")
    dist = tmp_path / "dist"
    build = subprocess.run(
        [
            "bash",
            "packaging/build.sh",
            "--no-cuda",
            "--dist",
            str(dist),
            "--work",
            str(tmp_path / "work"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    model = tiny_checkpoint()  # engine.testing.tiny: a random Qwen3.5 with its tokenizer
    shot = tmp_path / "bundle.png"
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "PYTHONPATH")}
    start = time.monotonic()
    run = subprocess.run(
        [
            "xvfb-run",
            "-a",
            "-s",
            "-screen 0 1280x800x24",
            str(dist / "snug" / "snug"),
            "--smoke",
            str(model),
            "--screenshot",
            str(shot),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - start
    assert run.returncode == 0, run.stderr[-4000:]
    assert shot.exists() and shot.stat().st_size > 10_000
    sys.stdout.write(f"bundle smoke: {took:.1f} s, {run.stdout.strip()}\n")
