"""Issue 28, items 4, 5, 6 and 9: local folders are checked when added and come back after a
restart; without a GPU each entry gets a verdict against RAM; Remove says what it does."""

from __future__ import annotations

import json
import shutil

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QFileDialog

from tests.app.helpers import answer_next_dialog, badge_texts, model_folder, settled

GIB = 1 << 30


def open_folder(qtbot, window, monkeypatch, folder) -> None:
    """Click "Open local folder…" and pick `folder` in the dialog."""
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    qtbot.mouseClick(window.library.open_button, Qt.MouseButton.LeftButton)


def test_local_folders_come_back_after_a_restart(qtbot, make_window, tmp_path, monkeypatch):
    path = str(tmp_path / "persist.ini")
    kept = model_folder(tmp_path / "kept-model")
    gone = model_folder(tmp_path / "gone-model")
    window = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    for folder in (kept, gone):
        open_folder(qtbot, window, monkeypatch, folder)
    keys = [e.key for e in window.ctx.library.entries()]
    assert f"folder:{kept}" in keys and f"folder:{gone}" in keys
    window.close()
    shutil.rmtree(gone)

    again = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    keys = [e.key for e in again.ctx.library.entries()]
    assert f"folder:{kept}" in keys, "the folder added before the restart is listed again"
    assert f"folder:{gone}" not in keys, "a folder that no longer exists is skipped"
    assert str(gone) in again.statusBar().currentMessage()


def test_a_folder_that_is_not_a_model_is_refused_when_added(
    qtbot, make_window, tmp_path, monkeypatch
):
    window = make_window()
    panel = window.library
    readme_only = tmp_path / "notes"
    readme_only.mkdir()
    (readme_only / "README.md").write_text("# my notes\n")
    before = len(window.ctx.library.entries())
    open_folder(qtbot, window, monkeypatch, readme_only)
    assert len(window.ctx.library.entries()) == before
    text = panel.message.text()
    assert str(readme_only) in text and "config.json" in text and ".safetensors" in text
    assert not panel.message.isHidden() and not panel.use_button.isEnabled()

    other = model_folder(tmp_path / "llama")
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    open_folder(qtbot, window, monkeypatch, other)
    assert len(window.ctx.library.entries()) == before
    assert str(other) in panel.message.text() and "Qwen3.5" in panel.message.text()

    good = model_folder(tmp_path / "qwen")
    open_folder(qtbot, window, monkeypatch, good)
    assert panel.selected().local_dir == str(good) and panel.use_button.isEnabled()
    assert panel.message.isHidden()


def test_without_a_gpu_each_entry_is_checked_against_ram(qtbot, make_window, monkeypatch):
    from app.state import host_fit

    monkeypatch.setattr(host_fit, "available_ram", lambda: 8 * GIB)
    window = make_window()  # no NVIDIA driver
    qtbot.waitUntil(lambda: bool(window.ctx.machine.no_gpu), timeout=3000)
    panel = window.library
    qtbot.waitUntil(settled(panel), timeout=10000)
    badges = badge_texts(panel)
    assert badges["qwen3.5-0.8b-4bit"] == "Fits in RAM (CPU)"
    assert badges["qwen3.5-9b-bf16"] == "Too large for RAM"
    assert len(set(badges.values())) > 1, "not one badge for every model"
    tip = panel.card("qwen3.5-9b-bf16").toolTip()
    assert "RAM" in tip and "8.0 GiB available" in tip
    assert "available RAM" in panel.hint.text() and "estimate" in panel.hint.text()
    # The Load panel shows the same verdict with its bytes.
    window.choose(window.ctx.library.find("qwen3.5-9b-bf16"))
    qtbot.waitUntil(lambda: window.load.badge.text() == "Too large for RAM", timeout=5000)
    assert any(t.startswith("Missing") for t in window.load.legend.items())


def test_removing_a_local_folder_says_the_files_stay(qtbot, make_window, tmp_path, monkeypatch):
    window = make_window()
    panel = window.library
    folder = model_folder(tmp_path / "mine")
    open_folder(qtbot, window, monkeypatch, folder)
    assert panel.delete_button.text() == "Remove from list"
    seen: list[str] = []
    answer_next_dialog("Remove from the list", seen)
    qtbot.mouseClick(panel.delete_button, Qt.MouseButton.LeftButton)
    assert not any("from disk?" in t for t in seen), seen
    assert any("stays on disk" in t for t in seen), seen
    assert window.ctx.library.find(f"folder:{folder}") is None
    assert (folder / "config.json").exists()


def test_a_download_error_goes_when_another_model_is_selected(qtbot, make_window):
    window = make_window()
    window.ctx.downloads._worker.endpoint = "http://127.0.0.1:9"
    panel = window.library
    panel.select("qwen3.5-2b-4bit")
    with qtbot.waitSignal(window.ctx.downloads.failed, timeout=5000):
        qtbot.mouseClick(panel.download_button, Qt.MouseButton.LeftButton)
    assert not panel.message.isHidden()
    qtbot.waitUntil(lambda: window.ctx.downloads.active is None, timeout=3000)
    from tests.app.test_planning_thread import click_entry

    click_entry(qtbot, panel, "qwen3.5-0.8b-4bit")
    assert panel.selected().key == "qwen3.5-0.8b-4bit"
    assert panel.message.isHidden()
