"""A search that finds the chat on show goes to the message it found there too: Enter in the
search box, or a click on the chat (the chat was already picked, so nothing else moved)."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

import app.panels.chat as chat_panel


def _write(folder, chat_id: str, turns: list[dict], when: float) -> None:
    raw = {"id": chat_id, "title": chat_id, "created": when, "updated": when, "turns": turns}
    (folder / f"{chat_id}.json").write_text(json.dumps(raw), encoding="utf-8")


def test_a_search_that_finds_the_chat_on_show_goes_to_its_message(
    qtbot, make_window, chats_dir, monkeypatch
):
    monkeypatch.setattr(chat_panel, "FOUND_MS", 300)
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}", "stats": {}}
        for i in range(100)
    ]
    turns[5]["content"] += " about the lighthouse keeper"
    _write(chats_dir, "long", turns, time.time())
    window = make_window()
    window.close_welcome()
    sidebar, panel, chats = window.sidebar, window.chat, window.ctx.chats
    assert chats.current.id == "long"
    assert panel.message_widgets()[0].turn is chats.current.turns[80]  # its last 20 drawn
    sidebar.search.setFocus()
    QTest.keyClicks(sidebar.search, "lighthouse")
    QTest.keyClick(sidebar.search, Qt.Key.Key_Return)
    assert sidebar.list.count() == 1 and chats.current.id == "long"
    widgets = panel.message_widgets()
    assert widgets[0].turn is chats.current.turns[0]  # drawn down to the message found
    assert widgets[5].property("found") is True
    qtbot.waitUntil(lambda: widgets[5].property("found") is False, timeout=2000)
    # A click on the chat, already on show, goes there again.
    item = sidebar.list.item(0)
    rect = sidebar.list.visualItemRect(item)
    QTest.mouseClick(sidebar.list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert widgets[5].property("found") is True
    qtbot.waitUntil(lambda: widgets[5].property("found") is False, timeout=2000)
    # A right click opens the chat's menu and goes nowhere.
    QTest.mouseClick(sidebar.list.viewport(), Qt.MouseButton.RightButton, pos=rect.center())
    assert widgets[5].property("found") is False
    # Enter in the search box emptied marks nothing.
    sidebar.search.clear()
    sidebar.search.setFocus()
    QTest.keyClick(sidebar.search, Qt.Key.Key_Return)
    assert not any(w.property("found") for w in panel.message_widgets())
