"""The chat search reads what a reply shows, its thinking and its answer, not the tags that
set the thinking apart; a reply found by its thinking opens with its thinking shown."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

import app.panels.chat as chat_panel
from app.state.chat_history import Turn


def _write(folder, chat_id: str, turns: list[dict], when: float) -> None:
    raw = {"id": chat_id, "title": chat_id, "created": when, "updated": when, "turns": turns}
    (folder / f"{chat_id}.json").write_text(json.dumps(raw), encoding="utf-8")


def _reply(content: str) -> dict:
    return {"role": "assistant", "content": content, "thinking_enabled": True, "stats": {}}


def test_the_thinking_tags_are_not_searched():
    reply = Turn("assistant", "Let me see.</think>\n\nYes.", thinking_enabled=True)
    assert not reply.holds("think")
    assert not reply.holds("</")
    assert reply.holds("let me see") and reply.holds("yes")
    # With thinking off, the tag the template closed is not shown either.
    plain = Turn("assistant", "<think>\nA plan.\n</think>\n\nDone.")
    assert not plain.holds("think>") and plain.holds("a plan") and plain.holds("done")
    user = Turn("user", "What does </think> do?")
    assert user.holds("</think>")  # a message of the user's is searched as typed


def test_a_reply_found_by_its_thinking_opens_with_the_thinking_shown(
    qtbot, make_window, chats_dir, monkeypatch
):
    monkeypatch.setattr(chat_panel, "FOUND_MS", 200)
    now = time.time()
    _write(
        chats_dir,
        "plans",
        [
            {"role": "user", "content": "Where should we go?", "stats": {}},
            _reply("The lighthouse tour is closed on Mondays.</think>\n\nGo on Tuesday."),
            {"role": "user", "content": "And after?", "stats": {}},
            _reply("Nothing more to weigh.</think>\n\nThe harbour."),
        ],
        now - 100,
    )
    _write(chats_dir, "newer", [{"role": "user", "content": "hello", "stats": {}}], now)
    window = make_window()
    window.close_welcome()
    sidebar, panel, chats = window.sidebar, window.chat, window.ctx.chats
    sidebar.search.setText("think")  # only the tags hold it: nothing found
    qtbot.waitUntil(lambda: not sidebar._search_timer.isActive(), timeout=2000)
    assert sidebar.list.count() == 0
    sidebar.search.setText("lighthouse")
    qtbot.waitUntil(lambda: sidebar.list.count() == 1, timeout=2000)
    sidebar.search.setFocus()
    QTest.keyClick(sidebar.search, Qt.Key.Key_Return)
    assert chats.current.id == "plans"
    widgets = panel.message_widgets()
    found = widgets[1]
    assert found.property("found") is True
    assert found.think_toggle.isChecked() and found.thinking_view.isVisibleTo(found)
    assert not widgets[3].think_toggle.isChecked()  # the others stay as they were
