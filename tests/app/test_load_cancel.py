"""A load under way stops at its next stage when Cancel is pressed; what it allocated is let
go (the engine releases a failed load), and the panel says so without an error."""

from __future__ import annotations

import time

from fake_engine import FakeEngine
from helpers import model_folder


def test_cancel_stops_a_load_at_its_next_stage(qtbot, make_window, tmp_path):
    stages: list[int] = []
    slow = FakeEngine.compiling_loader(stages)

    window = make_window(loader=slow)
    entry = window.ctx.library.add_folder(str(model_folder(tmp_path / "model")))
    window.choose(entry)
    panel = window.load
    panel.load_button.click()
    qtbot.waitUntil(lambda: panel.unload_button.text() == "Cancel", timeout=2000)
    qtbot.waitUntil(lambda: len(stages) >= 2, timeout=3000)
    assert panel.unload_button.isEnabled()
    with qtbot.waitSignal(window.ctx.engine.load_failed, timeout=3000) as failed:
        panel.unload_button.click()
    assert failed.args[0] == "LoadCancelled" and len(stages) < 100
    assert window.ctx.engine.state == "empty" and not window.ctx.engine.info
    assert panel.stage.text() == "Load cancelled." and panel.error.isHidden()
    assert panel.unload_button.text() == "Unload" and not panel.unload_button.isEnabled()
    loader_ok = FakeEngine.loader()
    window.ctx.engine._worker._loader = loader_ok  # the next load goes through
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        panel.load_button.click()
    assert window.ctx.engine.state == "ready"


def test_closing_the_window_during_a_load_stops_it_at_its_next_stage(qtbot, make_window, tmp_path):
    """Quitting while a first load compiles does not wait for the whole load: the window
    closes at the load's next stage, the engine's thread ended."""
    stages: list[int] = []
    slow = FakeEngine.compiling_loader(stages)

    window = make_window(loader=slow)
    entry = window.ctx.library.add_folder(str(model_folder(tmp_path / "model")))
    window.choose(entry)
    window.load.load_button.click()
    qtbot.waitUntil(lambda: len(stages) >= 2, timeout=3000)
    started = time.monotonic()
    window.close()
    assert time.monotonic() - started < 1.5 and len(stages) < 50
    assert not window.ctx.engine.thread.isRunning()
