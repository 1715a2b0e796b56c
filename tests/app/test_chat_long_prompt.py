"""A long prompt in the app: the status line says how far it has been read, and Stop ends it
there, leaving no empty reply behind."""

from __future__ import annotations

import time

from fake_engine import FakeEngine

from app.engine_bridge import LoadRequest
from engine.request_types import NO_TOKEN, GenerationStats, TokenEvent


class Reading(FakeEngine):
    """Runs its prompt in windows of 100 tokens (0.1 s each), as Engine.generate reports them."""

    reports_prompt_progress = True

    def generate(self, prompt_ids, params, cancel=None, progress=None):
        total = 1000
        for done in range(100, total + 1, 100):
            if cancel is not None and cancel.is_set():
                stats = GenerationStats(total, 0, 0.0, 0.0, 0.0)
                yield TokenEvent(NO_TOKEN, "", True, "cancelled", stats)
                return
            time.sleep(0.1)
            if progress is not None:
                progress(done, total)
        yield from super().generate(prompt_ids, params, cancel)


def test_the_status_line_follows_a_long_prompt_and_stop_ends_it(qtbot, make_window):
    window = make_window(loader=Reading.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    chats, status = window.ctx.chats, window.chat.status
    chats.send("Summarise the attached report")
    qtbot.waitUntil(lambda: status.text().startswith("Reading the prompt…"), timeout=3000)
    assert "of 1,000 tokens (Esc stops)" in status.text()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.stop()
    assert [t.role for t in chats.current.turns] == ["user"]  # no empty reply left
    assert status.text() == "Stopped before the reply began (Regenerate asks again)."
    assert window.chat.regen_button.isEnabled()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        chats.regenerate()
    assert [t.role for t in chats.current.turns] == ["user", "assistant"]
    assert chats.current.turns[-1].content.startswith("Hello")
