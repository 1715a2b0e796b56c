"""Issue 28, first run: the welcome view reads the machine, recommends the largest catalog
model that fits at 8K (or the CPU pick), and downloads and loads it with one click."""

from __future__ import annotations

import os

from fake_engine import FakeEngine
from hf_server import FakeHub
from PySide6.QtCore import QSettings, Qt

from tests.app.conftest import FakeGpu

GIB = 1 << 30


def test_first_run_recommends_what_fits_and_gets_it_in_one_click(qtbot, make_window, tmp_path):
    window = make_window(gpu_source=FakeGpu, loader=FakeEngine.loader())
    welcome = window.welcome
    assert window.center.currentWidget() is welcome
    qtbot.waitUntil(lambda: welcome.go_button.isEnabled(), timeout=10000)
    text = welcome.text()
    assert "Test GPU" in text and "8.00 GiB" in text
    rec = welcome.recommendation.entry
    assert rec is not None and rec.source == "catalog"
    # The largest that fits at 8K: nothing with more parameters fits (same planning).
    assert "8,192" in welcome.why.text() and rec.title in welcome.model_label.text()
    # in words a reader knows: "a context of 8,192 tokens", the catalog's names for models
    assert "a context of 8,192 tokens" in welcome.why.text()
    assert "(mlx4)" not in welcome.why.text() and "(bf16)" not in welcome.why.text()
    from app.state.fit import verdict_fits
    from app.state.recommend import params_of

    advisor = window.ctx.advisor
    for entry in window.ctx.library.entries():
        if entry.source == "catalog" and params_of(entry) > params_of(rec):
            assert not verdict_fits(advisor.verdict(entry, 8192, 1)), entry.title

    files = {"config.json": b'{"model_type": "qwen3_5"}', "model.safetensors": os.urandom(1 << 16)}
    with FakeHub({rec.repo: files}) as hub:
        window.ctx.downloads._worker.endpoint = hub.url
        with qtbot.waitSignal(window.ctx.engine.loaded, timeout=10000) as loaded:
            qtbot.mouseClick(welcome.go_button, Qt.MouseButton.LeftButton)
    assert loaded.args[0]["model_dir"] == window.ctx.library.find(rec.key).local_dir
    assert window.center.currentWidget() is window.chat


def test_without_a_gpu_it_recommends_the_cpu_pick_and_says_why(qtbot, make_window, monkeypatch):
    from app.state import host_fit

    monkeypatch.setattr(host_fit, "available_ram", lambda: 16 * GIB)
    window = make_window()
    welcome = window.welcome
    qtbot.waitUntil(lambda: welcome.go_button.isEnabled(), timeout=10000)
    assert welcome.recommendation.entry.key == "qwen3.5-0.8b-4bit"
    text = welcome.text()
    assert "No NVIDIA GPU" in text and "CPU" in text and "RAM" in text


def test_not_now_is_remembered(qtbot, make_window, tmp_path):
    path = str(tmp_path / "first.ini")
    window = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    assert window.center.currentWidget() is window.welcome
    qtbot.mouseClick(window.welcome.later_button, Qt.MouseButton.LeftButton)
    assert window.center.currentWidget() is window.chat
    window.close()
    again = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    assert again.center.currentWidget() is again.chat
