"""The chat list under date headings: drawn above each group's first chat, never an item of
their own, and following a chat that moves to the top."""

from __future__ import annotations

import json
from datetime import date, datetime, time, timedelta
from time import time as time_now

from PySide6.QtCore import Qt

from app.dates import date_group
from app.widgets.chat_groups import GROUP_ROLE


def _noon(day: date) -> float:
    return datetime.combine(day, time(12)).timestamp()


def _stamp(days: int, offset: float = 0.0) -> float:
    """A moment `days` before today, `offset` seconds earlier than now (today) or than noon
    (before): today's stays today and before now, whenever the test runs."""
    if days == 0:
        return time_now() - offset
    return _noon(date.today() - timedelta(days=days)) - offset


def test_each_age_has_its_group():
    today = date(2026, 12, 5)
    ago = {  # days before today: the group
        0: "Today",
        1: "Yesterday",
        2: "Previous 7 days",
        6: "Previous 7 days",
        7: "Previous 30 days",
        29: "Previous 30 days",
        30: "November",
        200: "May",
        350: "December 2025",
        800: "September 2024",
    }
    for days, group in ago.items():
        assert date_group(_noon(today - timedelta(days=days)), today) == group, days
    assert date_group(_noon(today + timedelta(days=2)), today) == "Today"  # a clock set back


def _write(folder, chat_id: str, when: float) -> None:
    turns = [{"role": "user", "content": f"about {chat_id}", "stats": {}}]
    raw = {"id": chat_id, "title": chat_id, "created": when, "updated": when, "turns": turns}
    (folder / f"{chat_id}.json").write_text(json.dumps(raw), encoding="utf-8")


def test_headings_go_above_each_groups_first_chat_and_follow_a_chat_moved_up(
    qtbot, make_window, chats_dir
):
    today = date.today()
    ages = {"a": 0, "b": 0, "c": 1, "d": 3, "e": 4, "f": 45}
    for name, days in ages.items():
        _write(chats_dir, name, _stamp(days, ord(name) / 1000))
    window = make_window()
    window.show()
    qtbot.waitExposed(window)
    listed = window.sidebar.list

    def rows():
        return [
            (listed.item(i).text(), listed.item(i).data(GROUP_ROLE)) for i in range(listed.count())
        ]

    far = date_group(_noon(today - timedelta(days=45)), today)
    assert rows() == [
        ("a", "Today"),
        ("b", None),
        ("c", "Yesterday"),
        ("d", "Previous 7 days"),
        ("e", None),
        ("f", far),
    ]  # one item a chat: the headings are drawn, not listed
    heights = [listed.visualItemRect(listed.item(i)).height() for i in range(listed.count())]
    assert heights[0] > heights[1] and heights[2] > heights[1] and heights[4] == heights[1]
    listed.grab()  # drawn with its headings
    # Yesterday's only chat answered now: to the top, under Today; its heading goes.
    chats = window.ctx.chats
    chats.store.save(chats.store.get("c"))
    assert rows() == [
        ("c", "Today"),
        ("a", None),
        ("b", None),
        ("d", "Previous 7 days"),
        ("e", None),
        ("f", far),
    ]
    # Searched: the headings of the chats found.
    window.sidebar.search.setText("about e")
    qtbot.waitUntil(lambda: listed.count() == 1, timeout=2000)
    assert rows() == [("e", "Previous 7 days")]
    window.sidebar.search.clear()
    # The keyboard moves from chat to chat: Down from "b" selects "d", past the heading.
    chats.select("b")
    listed.setFocus()
    qtbot.keyClick(listed, Qt.Key.Key_Down)
    assert chats.current.id == "d"


def test_a_pinned_chat_is_listed_first_under_pinned_and_kept_so_in_its_file(
    qtbot, make_window, chats_dir, monkeypatch
):
    from PySide6.QtWidgets import QMenu

    import app.panels.sidebar as sidebar_module
    from app.state.chat_store import ChatStore

    today = date.today()
    for name, days in {"new": 0, "old": 40, "older": 50}.items():
        _write(chats_dir, name, _stamp(days))
    window = make_window()
    listed, chats = window.sidebar.list, window.ctx.chats

    def rows():
        return [
            (listed.item(i).text(), listed.item(i).data(GROUP_ROLE)) for i in range(listed.count())
        ]

    # Pinned from the chat's context menu: "Pin chat" is its first action.
    chosen = []

    class FirstPicked(QMenu):
        def exec(self, *args):
            chosen.append([a.text() for a in self.actions()])
            return self.actions()[0]

    monkeypatch.setattr(sidebar_module, "QMenu", FirstPicked)
    row = next(i for i in range(listed.count()) if listed.item(i).text() == "older")
    window.sidebar._menu(listed.visualItemRect(listed.item(row)).center())
    assert chosen[-1][0] == "Pin chat"
    older = chats.store.get("older")
    assert older.pinned and older.updated == _stamp(50)  # date kept
    month = date_group(_stamp(40), today)
    assert rows() == [("older", "Pinned"), ("new", "Today"), ("old", month)]
    # The pin is in the chat's file: a restart lists it first.
    assert json.loads(chats.store.path("older").read_text("utf-8"))["pinned"] is True
    assert ChatStore(chats_dir).get("older").pinned
    # A pinned chat answered stays under Pinned; another one saved goes below the pins.
    chats.store.save(chats.store.get("old"))
    assert rows() == [("older", "Pinned"), ("old", "Today"), ("new", None)]
    # Unpinned: back among the dates.
    window.sidebar._menu(listed.visualItemRect(listed.item(0)).center())
    assert chosen[-1][0] == "Unpin chat"
    assert rows() == [("old", "Today"), ("new", None), ("older", month)]


def test_a_chat_files_pin_is_checked_when_read(chats_dir):
    from app.state.chat_store import ChatStore

    _write(chats_dir, "plain", 1000.0)  # an older file: not pinned
    raw = {"id": "odd", "pinned": "yes", "turns": []}
    (chats_dir / "odd.json").write_text(json.dumps(raw), "utf-8")
    store = ChatStore(chats_dir)
    assert [c.id for c in store.chats()] == ["plain"] and not store.get("plain").pinned
    problem = store.problems[0]
    assert "odd.json" in problem and "pinned is 'yes', not true/false" in problem
