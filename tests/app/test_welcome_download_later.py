"""The first-run view's "Download and load", left for another model: once the download
ends it is listed as downloaded, and the model the user loaded meanwhile stays loaded."""

from __future__ import annotations

import os

from fake_engine import FakeEngine
from helpers import model_folder
from hf_server import FakeHub
from PySide6.QtCore import Qt

from tests.app.conftest import FakeGpu


def test_a_model_loaded_meanwhile_is_not_replaced_when_the_download_ends(
    qtbot, make_window, tmp_path
):
    loader = FakeEngine.loader()
    window = make_window(gpu_source=FakeGpu, loader=loader)
    welcome, engine = window.welcome, window.ctx.engine
    qtbot.waitUntil(lambda: welcome.go_button.isEnabled(), timeout=10000)
    rec = welcome.recommendation.entry
    files = {"config.json": b'{"model_type": "qwen3_5"}', "model.safetensors": os.urandom(2 << 20)}
    with FakeHub({rec.repo: files}) as hub:
        hub.delay_s = 0.05  # 32 chunks: about 1.6 s
        window.ctx.downloads._worker.endpoint = hub.url
        qtbot.mouseClick(welcome.go_button, Qt.MouseButton.LeftButton)
        qtbot.mouseClick(welcome.other_button, Qt.MouseButton.LeftButton)  # another model
        assert window.center.currentWidget() is window.chat
        mine = window.library.add_folder(str(model_folder(tmp_path / "mine")))
        with qtbot.waitSignal(engine.loaded, timeout=3000):
            window.choose_and_load(mine)
        assert window.ctx.downloads.active == rec.repo  # still downloading
        with qtbot.waitSignal(window.ctx.downloads.finished, timeout=10000):
            pass
    qtbot.wait(200)
    assert [r.model_dir for r in loader.requests] == [mine.local_dir]
    assert engine.state == "ready" and engine.info["model_dir"] == mine.local_dir
    assert window.ctx.library.find(rec.key).downloaded
    assert f"{rec.title} is downloaded" in window.statusBar().currentMessage()
