"""A long-time user's history: chats of hundreds of messages and a list of hundreds of chats.
The work each common action does is counted (widgets built, redraws, items made, messages
searched), so that it stays bounded by what is on screen, not by the size of the history."""

from __future__ import annotations

import json
import time

import pytest
from fake_engine import FakeEngine
from PySide6.QtCore import QCoreApplication

import app.panels.chat as chat_panel
import app.panels.sidebar as sidebar_module
from app.engine_bridge import LoadRequest
from app.widgets.message import AutoHeightBrowser, MessageWidget

CODE = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(300)) + "\n```\n"


def _write_chats(folder, count: int, turns: int = 2, big: int = 0) -> None:
    """`count` chats of `turns` messages; with `big`, one more ("big", the newest) of that
    many."""
    now = time.time()
    for k in range(count):
        _write(folder, f"c{k:04d}", turns, now - 1000 - k)
    if big:
        _write(folder, "big", big, now)


def _write(folder, chat_id: str, n: int, when: float) -> None:
    turns = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        turns.append({"role": role, "content": f"message {i} of {chat_id}", "stats": {}})
    raw = {"id": chat_id, "title": chat_id, "created": when, "updated": when, "turns": turns}
    (folder / f"{chat_id}.json").write_text(json.dumps(raw), encoding="utf-8")


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


@pytest.fixture
def built(monkeypatch):
    """How many MessageWidgets the chat panel builds."""
    made = []

    class Counted(MessageWidget):
        def __init__(self, turn, parent=None):
            made.append(turn)
            super().__init__(turn, parent)

    monkeypatch.setattr(chat_panel, "MessageWidget", Counted)
    return made


def test_a_chat_of_hundreds_of_messages_draws_its_last_page_and_more_on_demand(
    qtbot, make_window, chats_dir, built
):
    _write_chats(chats_dir, 3, big=300)
    window = make_window()
    chats, panel = window.ctx.chats, window.chat
    assert chats.current.id == "big"
    shown = panel.message_widgets()
    assert len(built) == len(shown) == chat_panel.PAGE  # not 300
    assert shown[-1].turn is chats.current.turns[-1]
    assert not panel.earlier_button.isHidden() and "280 not shown" in panel.earlier_button.text()
    panel.earlier_button.click()
    shown = panel.message_widgets()
    assert len(shown) == 2 * chat_panel.PAGE == len(built)
    assert "260 not shown" in panel.earlier_button.text()
    assert [w.turn for w in shown] == chats.current.turns[-2 * chat_panel.PAGE :]
    chats.select("c0001")
    built.clear()
    chats.select("big")  # shown again: its last page alone
    assert len(built) == chat_panel.PAGE
    assert not panel.message_widgets()[-2].edit_button.isHidden()  # the last message's Edit


def test_a_reply_in_a_long_chat_redraws_only_the_tail(qtbot, make_window, chats_dir, built):
    _write_chats(chats_dir, 1, big=300)
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    built.clear()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("One more")
    qtbot.waitUntil(lambda: not window.ctx.chats.busy, timeout=3000)
    turns = window.ctx.chats.current.turns
    assert len(turns) == 302 and window.chat.message_widgets()[-1].turn is turns[-1]
    assert len(built) <= 4  # the message, the reply as it began and as it ended


def test_a_streamed_reply_is_redrawn_at_most_once_an_interval(qtbot, make_window, monkeypatch):
    window = make_window(loader=FakeEngine.loader(script=["x"], delay=0.2))
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    drawn = []
    original = MessageWidget.update_text
    monkeypatch.setattr(
        MessageWidget, "update_text", lambda self, text, done=False: drawn.append(text)
    )
    chats.send("Write a lot of code")
    qtbot.waitUntil(lambda: chats.busy, timeout=1000)
    drawn.clear()
    text = ""
    for i in range(200):  # 200 batches of tokens arrive while the GUI thread is busy
        text += f"line {i}\n"
        chats.reply_grew.emit(chats.current.id, text)
    assert len(drawn) <= 1
    qtbot.waitUntil(lambda: drawn and drawn[-1] == text, timeout=2000)  # the last text shows
    assert len(drawn) <= 2
    monkeypatch.setattr(MessageWidget, "update_text", original)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.stop()
    assert panel.redraws >= 1


def test_a_long_code_block_is_laid_out_once_not_once_a_line(qtbot):
    view = AutoHeightBrowser(copy_links=True)
    qtbot.addWidget(view)
    view.resize(600, 300)
    view.show()
    changes = []
    view.document().contentsChange.connect(lambda *_args: changes.append(1))
    view.set_markdown("Here it is:\n\n" + CODE)
    assert len(changes) <= 5  # was one a line of code: 300
    block = view.document().findBlock(view.document().characterCount() // 2)
    assert not block.blockFormat().nonBreakableLines()  # the code wraps


def test_saves_and_switches_change_one_sidebar_item_not_the_whole_list(
    qtbot, make_window, chats_dir, monkeypatch
):
    _write_chats(chats_dir, 200)
    made = []

    class Counted(sidebar_module.QListWidgetItem):
        def __init__(self, *args):
            made.append(args)
            super().__init__(*args)

    monkeypatch.setattr(sidebar_module, "QListWidgetItem", Counted)
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    chats, sidebar = window.ctx.chats, window.sidebar
    made.clear()
    chats.select("c0150")
    chats.select("c0100")
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("A question")
    qtbot.waitUntil(lambda: not chats.busy, timeout=3000)
    chats.store.rename("c0007", "Renamed")
    assert len(made) <= 4  # one item a save, not 200
    rows = [sidebar.list.item(i).text() for i in range(sidebar.list.count())]
    assert rows == [c.title for c in chats.store.chats()]  # newest first, as ever
    assert rows[0] == "c0100" and "Renamed" in rows  # the chat just answered goes first
    assert sidebar.list.currentItem().text() == "c0100"


def test_search_runs_once_typing_pauses_not_at_each_key(qtbot, make_window, chats_dir, monkeypatch):
    _write_chats(chats_dir, 100)
    searched = []
    real = sidebar_module.matches
    monkeypatch.setattr(
        sidebar_module, "matches", lambda chat, query: searched.append(query) or real(chat, query)
    )
    window = make_window()
    sidebar = window.sidebar
    window.activateWindow()
    sidebar.search.setFocus()
    qtbot.waitUntil(sidebar.search.hasFocus, timeout=1000)
    qtbot.keyClicks(sidebar.search, "of c0042")
    QCoreApplication.processEvents()
    qtbot.waitUntil(lambda: sidebar.list.count() == 1, timeout=2000)
    assert len(searched) == 100 and set(searched) == {"of c0042"}  # 800 at one a key
    assert sidebar.list.item(0).text() == "c0042"
