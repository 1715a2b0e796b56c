"""A chat renamed in the list while a reply streams into it: the saves the reply makes as
it streams leave the title being typed alone, and it is kept once Enter is pressed."""

from __future__ import annotations

from fake_engine import FakeEngine
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QLineEdit

import app.chat_controller as chat_controller
from app.engine_bridge import LoadRequest


def test_a_title_typed_while_the_chat_streams_is_kept(qtbot, make_window, monkeypatch):
    monkeypatch.setattr(chat_controller, "SAVE_EVERY_S", 0.05)  # saves come while typing
    window = make_window(loader=FakeEngine.loader(delay=0.01, script=["word "] * 400))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.close_welcome()
    chats, sidebar = window.ctx.chats, window.sidebar
    chats.new_chat()
    assert chats.send("An older chat")
    qtbot.waitUntil(lambda: not chats.busy, timeout=10000)
    older = chats.current.id
    chats.new_chat()
    assert chats.send("What should I call this?")
    streaming = chats.current.id
    writes = chats.store.writes

    sidebar.list.editItem(sidebar.list.currentItem())  # F2, as a person renames it
    editor = QApplication.focusWidget()
    assert isinstance(editor, QLineEdit)
    QTest.keyClicks(editor, "Trip")
    qtbot.waitUntil(lambda: chats.store.writes >= writes + 3, timeout=3000)  # saved meanwhile
    QTest.keyClicks(QApplication.focusWidget(), " planning")
    assert QApplication.focusWidget() is editor and chats.busy
    QTest.keyClick(editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chats.store.get(streaming).title == "Trip planning", timeout=2000)
    qtbot.waitUntil(lambda: not chats.busy, timeout=10000)
    ids = [sidebar.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(2)]
    assert ids == [streaming, older]  # the chat answered last is first
    assert sidebar.list.item(0).text() == "Trip planning"
