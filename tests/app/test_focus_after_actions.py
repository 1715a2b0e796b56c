"""The keyboard goes where the next thing to do is typed: New chat (its button or Ctrl+N) and
Branch put it in the message box of the chat they show."""

from __future__ import annotations

from fake_engine import FakeEngine
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.engine_bridge import LoadRequest


def test_new_chat_and_branch_put_the_keyboard_in_the_message_box(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.close_welcome()
    window.activateWindow()
    qtbot.waitActive(window)
    chats, sidebar, panel = window.ctx.chats, window.sidebar, window.chat
    assert chats.send("First question")
    qtbot.waitUntil(lambda: not chats.busy, timeout=5000)
    first = chats.current.id

    sidebar.new_button.setFocus()
    QTest.mouseClick(sidebar.new_button, Qt.MouseButton.LeftButton)
    assert chats.current.id != first
    assert QApplication.focusWidget() is panel.input
    QTest.keyClicks(QApplication.focusWidget(), "typed at once")
    assert panel.input.toPlainText() == "typed at once"

    chats.select(first)
    sidebar.list.setFocus()
    QTest.keyClick(sidebar.list, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert chats.current.id != first and not chats.current.turns
    assert QApplication.focusWidget() is panel.input

    chats.select(first)
    reply = panel.message_widgets()[-1]
    reply.branch_button.setFocus()
    QTest.mouseClick(reply.branch_button, Qt.MouseButton.LeftButton)
    assert chats.current.title.endswith("(branch)")
    assert QApplication.focusWidget() is panel.input
