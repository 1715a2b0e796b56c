"""A chat picked from the search's results opens where the search found it: the message that
holds the words is drawn (the earlier pages with it, in a long chat), brought into view and
marked for a moment."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import QCoreApplication, Qt

import app.panels.chat as chat_panel


def _write(folder, chat_id: str, n: int, when: float, needle_at: int) -> None:
    turns = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"message {i}" + (" about the lighthouse keeper" if i == needle_at else "")
        turns.append({"role": role, "content": text, "stats": {}})
    raw = {"id": chat_id, "title": chat_id, "created": when, "updated": when, "turns": turns}
    (folder / f"{chat_id}.json").write_text(json.dumps(raw), encoding="utf-8")


def test_a_chat_found_by_a_message_opens_at_that_message(
    qtbot, make_window, chats_dir, monkeypatch
):
    monkeypatch.setattr(chat_panel, "FOUND_MS", 200)
    now = time.time()
    _write(chats_dir, "long", 120, now - 100, needle_at=7)  # five pages back
    _write(chats_dir, "newer", 4, now, needle_at=-1)
    window = make_window()
    window.resize(1000, 700)
    window.show()
    window.close_welcome()
    qtbot.waitExposed(window)
    sidebar, panel, chats = window.sidebar, window.chat, window.ctx.chats
    assert chats.current.id == "newer"
    sidebar.search.setText("Lighthouse KEEPER")
    qtbot.waitUntil(lambda: sidebar.list.count() == 1, timeout=2000)
    sidebar.search.setFocus()
    qtbot.keyClick(sidebar.search, Qt.Key.Key_Down)  # to the chat found
    assert chats.current.id == "long"
    found = next(w for w in panel.message_widgets() if "lighthouse" in w.turn.content)
    assert panel.message_widgets().index(found) == 7  # the pages down to it drawn
    assert found.property("found") is True

    def in_view() -> bool:
        QCoreApplication.processEvents()
        viewport = panel.scroll.viewport()
        top = found.mapTo(viewport, found.rect().topLeft()).y()
        return 0 <= top and top + found.height() <= viewport.height()  # all of it

    qtbot.waitUntil(in_view, timeout=2000)
    qtbot.waitUntil(lambda: found.property("found") is False, timeout=2000)  # the mark goes
    # A chat found by its title alone opens as any chat does, at its end.
    sidebar.search.setText("newer")
    qtbot.waitUntil(lambda: sidebar.list.count() == 1, timeout=2000)
    qtbot.keyClick(sidebar.search, Qt.Key.Key_Down)
    assert chats.current.id == "newer"
    assert not any(w.property("found") for w in panel.message_widgets())
