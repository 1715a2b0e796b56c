"""A reply's thinking opened while it streams stays open when the reply ends (the reply is
drawn again with its stats) and when the theme changes; a new reply starts closed."""

from __future__ import annotations

from fake_engine import THINKING_REPLY, FakeEngine

from app import theme
from app.engine_bridge import LoadRequest


def test_thinking_opened_during_a_reply_stays_open_after_it(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(script=THINKING_REPLY * 3, delay=0.03))
    window.ctx.settings.set("chat/thinking", True)
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.close_welcome()
    chats, panel = window.ctx.chats, window.chat
    assert chats.send("What is six times seven?")
    qtbot.waitUntil(lambda: panel.message_widgets()[-1].think_toggle.isVisible(), timeout=3000)
    streaming = panel.message_widgets()[-1]
    streaming.think_toggle.click()  # the reader opens it to follow the thinking
    assert streaming.thinking_view.isVisible()
    qtbot.waitUntil(lambda: not chats.busy, timeout=5000)
    reply = panel.message_widgets()[-1]
    assert reply.think_toggle.text().startswith("Thought")  # drawn again, as ended
    assert reply.think_toggle.isChecked() and reply.thinking_view.isVisible()

    theme.apply("dark")
    try:
        again = panel.message_widgets()[-1]
        assert again is not reply and again.thinking_view.isVisibleTo(again)
    finally:
        theme.apply("light")

    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        assert chats.regenerate()
    assert not panel.message_widgets()[-1].thinking_view.isVisibleTo(panel)  # another reply
