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


def test_the_message_box_has_the_keyboard_when_the_chat_first_shows(
    qtbot, make_window, settings_store
):
    from app.panels.welcome import DONE_KEY

    window = make_window()  # the first start: the first-run view
    assert window.center.currentWidget() is window.welcome
    qtbot.mouseClick(window.welcome.later_button, Qt.MouseButton.LeftButton)
    assert window.center.currentWidget() is window.chat
    assert window.focusWidget() is window.chat.input  # the window's, once active
    window.close()
    assert settings_store.value(DONE_KEY) in (True, "true")
    again = make_window()  # a later start opens on the chat
    assert again.center.currentWidget() is again.chat
    assert again.focusWidget() is again.chat.input
