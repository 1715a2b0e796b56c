"""Another model loaded while a reply streams: the reply stops, and until the new model is
in, the window says it is loading (Cancel, no Send), not that the old one is ready."""

from __future__ import annotations

import threading

from fake_engine import FakeEngine
from helpers import model_folder


def test_a_load_pressed_during_a_reply_shows_loading_until_it_ends(qtbot, make_window, tmp_path):
    gate = threading.Event()
    requests = []

    def loader(request, progress=None):
        requests.append(request)
        if len(requests) == 2:  # the second model takes a while to load
            gate.wait(10)
        return FakeEngine(delay=0.02, script=["word "] * 500)

    window = make_window(loader=loader)
    first = window.ctx.library.add_folder(str(model_folder(tmp_path / "first")))
    second = window.ctx.library.add_folder(str(model_folder(tmp_path / "second")))
    engine, panel = window.ctx.engine, window.load
    window.choose(first)
    with qtbot.waitSignal(engine.loaded, timeout=3000):
        panel.load_button.click()
    assert window.ctx.chats.send("hello")
    qtbot.waitUntil(lambda: bool(window.ctx.chats.current.turns[-1].content), timeout=3000)

    window.choose(second)
    with qtbot.waitSignal(engine.finished, timeout=3000) as ended:  # the reply stops
        panel.load_button.click()
    qtbot.waitUntil(lambda: len(requests) == 2, timeout=3000)
    try:
        assert ended.args[1]["finish_reason"] == "cancelled"
        assert engine.state == "loading"
        assert panel.unload_button.text() == "Cancel" and not panel.load_button.isEnabled()
        assert window.model_status.text() == "Loading model…"
        assert not window.chat.send_button.isEnabled()
        assert window.ctx.chats.current.turns[-1].stats["finish_reason"] == "cancelled"
    finally:
        gate.set()
    with qtbot.waitSignal(engine.loaded, timeout=3000) as loaded:
        pass
    assert loaded.args[0]["model_dir"] == second.local_dir and engine.state == "ready"
    assert window.chat.send_button.isEnabled()
