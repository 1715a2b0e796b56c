"""A message copied as Markdown, the last message taken back to edit, a chat renamed in the
sidebar, exported as Markdown and found by its search box."""

from __future__ import annotations

import json
from datetime import datetime

from fake_engine import THINKING_REPLY, FakeEngine
from helpers import answer_next_dialog
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel

from app.dates import message_time
from app.engine_bridge import LoadRequest
from app.panels.chat import EDIT_EARLIER, EDIT_LAST
from app.state.chat_history import Turn
from app.state.chat_store import TITLE_MAX


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


def test_copy_takes_the_messages_markdown_without_its_thinking(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(script=THINKING_REPLY))
    window.ctx.settings.set("chat/thinking", True)
    _load(qtbot, window)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("What is **six** times seven?")
    question, reply = window.chat.message_widgets()[-2:]
    clipboard = QGuiApplication.clipboard()
    qtbot.mouseClick(reply.copy_button, Qt.MouseButton.LeftButton)
    assert clipboard.text() == "The answer is 42."
    assert reply.copy_button.text() == "Copied"
    qtbot.waitUntil(lambda: reply.copy_button.text() == "Copy", timeout=3000)
    qtbot.mouseClick(question.copy_button, Qt.MouseButton.LeftButton)
    assert clipboard.text() == "What is **six** times seven?"  # the Markdown, not the view


def test_a_chat_renamed_in_the_sidebar_keeps_its_name_and_place(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    chats, sidebar = window.ctx.chats, window.sidebar
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("First question")
    first = chats.current.id
    chats.new_chat()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Second question")
    order = [sidebar.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(2)]
    item = next(sidebar.list.item(i) for i in range(2) if order[i] == first)
    assert item.flags() & Qt.ItemFlag.ItemIsEditable
    item.setText("  Trip   planning\n")  # what the in-place editor commits
    qtbot.waitUntil(lambda: chats.store.get(first).title == "Trip planning", timeout=2000)
    texts = [sidebar.list.item(i).text() for i in range(2)]
    ids = [sidebar.list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(2)]
    assert ids == order and "Trip planning" in texts  # renaming does not move it up
    saved = json.loads(chats.store.path(first).read_text(encoding="utf-8"))
    assert saved["title"] == "Trip planning"
    chats.select(first)
    assert window.chat.title.text() == "Trip planning"
    second = next(i for i in ids if i != first)
    chats.select(second)  # the list is drawn again: its items are new
    item = next(sidebar.list.item(i) for i in range(2) if ids[i] == second)
    item.setText("Shown above the chat too")
    qtbot.waitUntil(lambda: window.chat.title.text() == "Shown above the chat too", timeout=2000)
    chats.select(first)

    item = next(sidebar.list.item(i) for i in range(2) if ids[i] == first)
    item.setText("   ")  # a blank name keeps the one it had
    qtbot.waitUntil(
        lambda: any(sidebar.list.item(i).text() == "Trip planning" for i in range(2)),
        timeout=2000,
    )
    assert chats.store.get(first).title == "Trip planning"
    assert chats.store.rename(first, "x" * 200) == "x" * TITLE_MAX + "…"
    window.close()
    again = make_window(loader=FakeEngine.loader())
    titles = [again.sidebar.list.item(i).text() for i in range(again.sidebar.list.count())]
    assert "x" * TITLE_MAX + "…" in titles


def test_a_long_title_ends_in_an_ellipsis_and_leaves_the_columns_as_they_were(qtbot, make_window):
    """A title of TITLE_MAX wide letters is cut with "…" above the chat (the whole of it in
    the tooltip), and neither widens the chat's column nor squeezes the sidebar and the
    right column."""
    window = make_window()
    chats = window.ctx.chats
    qtbot.wait(50)
    widths = window.splitter.sizes()
    chats.store.rename(chats.current.id, "W" * TITLE_MAX)
    qtbot.wait(50)
    assert window.splitter.sizes() == widths
    title = window.chat.title
    assert title.text() == "W" * TITLE_MAX and title.toolTip() == "W" * TITLE_MAX
    assert QLabel.text(title).endswith(
        "…"
    ) and title.width() < title.fontMetrics().horizontalAdvance("W" * TITLE_MAX)
    chats.store.rename(chats.current.id, "Short")
    assert QLabel.text(title) == "Short" and title.toolTip() == ""


def test_the_last_message_comes_back_to_the_composer_to_edit(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(script=["tok "] * 200, delay=0.01))
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        chats.send("First question")
    chats.send("Second question, with a typo")
    qtbot.waitUntil(lambda: chats.busy and bool(chats.current.turns[-1].content), timeout=2000)
    edits = [not m.edit_button.isHidden() for m in panel.message_widgets()]
    assert not any(edits)  # nothing to take back while a reply is generating
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        chats.stop()
    qtbot.waitUntil(lambda: not chats.busy, timeout=1000)
    shown = [(m.property("role"), not m.edit_button.isHidden()) for m in panel.message_widgets()]
    assert shown == [("user", True), ("assistant", False), ("user", True), ("assistant", False)]
    tips = [m.edit_button.toolTip() for m in panel.message_widgets()[::2]]
    assert tips == [EDIT_EARLIER, EDIT_LAST]  # the first one's Edit branches the chat
    panel.input.setPlainText("a draft")
    qtbot.mouseClick(panel.message_widgets()[2].edit_button, Qt.MouseButton.LeftButton)
    assert panel.input.toPlainText() == "Second question, with a typo\n\na draft"
    assert [t.content for t in chats.current.turns if t.role == "user"] == ["First question"]
    left = panel.message_widgets()
    assert len(left) == 2 and not left[0].edit_button.isHidden()
    saved = json.loads(chats.store.path(chats.current.id).read_text(encoding="utf-8"))
    assert len(saved["turns"]) == 2  # saved without the taken-back message and its reply
    panel.input.setPlainText("Second question, fixed")
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        panel.send()
    users = [t.content for t in chats.current.turns if t.role == "user"]
    assert users == ["First question", "Second question, fixed"]


def test_a_chat_exports_as_markdown(qtbot, make_window, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QFileDialog

    window = make_window(loader=FakeEngine.loader(script=THINKING_REPLY))
    window.ctx.settings.set("chat/thinking", True)
    _load(qtbot, window)
    chats = window.ctx.chats
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("What is six times seven?")
    asked = []

    def save_as(parent, caption, start, filters):
        asked.append(start)
        return target, filters.split(";;")[0]

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_as)
    target = str(tmp_path / "six.md")
    window.sidebar.export(chats.current.id)
    assert asked[0].endswith("What is six times seven.md")  # no '?' in the file name offered
    text = (tmp_path / "six.md").read_text(encoding="utf-8")
    asked_at, answered_at = (message_time(t.sent, datetime.now())[1] for t in chats.current.turns)
    assert text == (
        f"# What is six times seven?\n\n**You** ({asked_at})\n\nWhat is six times seven?\n\n"
        f"**Snug** ({answered_at})\n\n"
        "<details><summary>Thought</summary>\n\nLet me think.\n\n</details>\n\n"
        "The answer is 42.\n"
    )
    assert window.chat.status.text() == f"Chat exported to {target}"
    target = str(tmp_path)  # a folder: the write fails, and the status line says so
    window.sidebar.export(chats.current.id)
    assert window.chat.status.text().startswith(f"Could not export the chat to {tmp_path}")


def test_the_sidebar_finds_chats_by_title_or_message(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    chats, sidebar = window.ctx.chats, window.sidebar
    for text in ("Plan a trip to Lisbon", "Bake bread", "Fix my bike"):
        chats.new_chat()
        with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
            chats.send(text)
    chats.current.turns.append(Turn("user", "And what FLOUR for the tyres?"))  # "Fix my bike"

    def titles():
        return sorted(sidebar.list.item(i).text() for i in range(sidebar.list.count()))

    assert titles() == ["Bake bread", "Fix my bike", "Plan a trip to Lisbon"]
    sidebar.search.setText("lisbon")  # searched once typing pauses
    qtbot.waitUntil(lambda: titles() == ["Plan a trip to Lisbon"], timeout=2000)
    sidebar.search.setText("flour")  # in a message, not a title, any case
    qtbot.waitUntil(lambda: titles() == ["Fix my bike"], timeout=2000)
    sidebar.search.setText("nothing like this")
    qtbot.waitUntil(lambda: titles() == [], timeout=2000)
    sidebar.search.clear()
    assert titles() == ["Bake bread", "Fix my bike", "Plan a trip to Lisbon"]
    window.activateWindow()
    window.chat.input.setFocus()
    qtbot.waitUntil(lambda: window.chat.input.hasFocus(), timeout=1000)
    qtbot.keyClick(window.chat.input, Qt.Key.Key_F, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: sidebar.search.hasFocus(), timeout=1000)  # Ctrl+F


def test_a_cut_reply_goes_on_where_it_stopped(qtbot, make_window):
    """Continue, on a reply cut by the token limit: the prompt it answered, then its text
    so far, and what comes is added to the same reply."""
    load = FakeEngine.loader(script=["one ", "two ", "three ", "four "])
    window = make_window(loader=load)
    window.ctx.settings.set("sampling/max_new_tokens", 2)
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Count for me")
    reply = panel.message_widgets()[-1]
    assert chats.current.turns[-1].content == "one two "
    assert chats.current.turns[-1].stats["finish_reason"] == "length"
    assert not reply.continue_button.isHidden()
    assert panel.message_widgets()[0].continue_button.isHidden()  # a message of the user's
    engine = load.made[-1]
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    answered = engine.calls[-1]  # the messages the reply answered, not the reply
    assert answered[-1] == {"role": "user", "content": "Count for me"}
    assert all(m["role"] != "assistant" for m in answered)
    assert engine.prompts[-1] == engine.chat_ids(answered) + engine.tokenizer.encode("one two ")
    # one reply: its penalties count the text it had (the settings' presence penalty)
    assert engine.params[-1].earlier == tuple(engine.tokenizer.encode("one two "))
    assert engine.params[0].earlier == () and engine.params[-1].presence_penalty == 1.5
    turns = chats.current.turns
    assert [t.role for t in turns] == ["user", "assistant"]
    assert turns[-1].content == "one two one two " and turns[-1].stats["new_tokens"] == 4
    assert "one two one two" in panel.message_widgets()[-1].answer_text()
    window.ctx.settings.set("sampling/max_new_tokens", 100)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.continue_reply()
    assert turns[-1].stats["finish_reason"] == "stop"
    assert panel.message_widgets()[-1].continue_button.isHidden()  # ended: nothing to go on
    assert not chats.continue_reply()


def test_a_long_chat_redraws_only_its_tail(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    chat = chats.current
    for i in range(40):  # a long conversation, as a file from an earlier day holds it
        chat.turns += [Turn("user", f"question {i}"), Turn("assistant", f"answer {i}")]
    chats.turns_changed.emit(chat.id)
    before = panel.message_widgets()
    assert len(before) == 80
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("one more")
    after = panel.message_widgets()
    assert len(after) == 82 and all(a is b for a, b in zip(before, after[:80], strict=True))
    assert after[-1].answer_text().startswith("Hello")  # the reply, drawn at its end
    assert not after[80].edit_button.isHidden()
    assert before[-2].edit_button.toolTip() == EDIT_EARLIER  # no more the last
    qtbot.mouseClick(after[80].edit_button, Qt.MouseButton.LeftButton)
    assert panel.input.toPlainText() == "one more"
    assert panel.message_widgets() == before  # the tail went; the rest stayed as drawn


def test_deleting_the_chat_on_show_asks_then_shows_another(qtbot, make_window, chats_dir):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    chats, sidebar = window.ctx.chats, window.sidebar
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Keep this one")
    chats.new_chat()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Delete this one")
    doomed = chats.current.id
    window.activateWindow()
    sidebar.list.setFocus()
    qtbot.waitUntil(lambda: sidebar.list.hasFocus(), timeout=1000)
    seen: list[str] = []
    answer_next_dialog("Cancel", seen)
    qtbot.keyClick(sidebar.list, Qt.Key.Key_Delete)  # the Delete key asks first
    assert "Delete the chat “Delete this one”?" in seen
    assert chats.store.get(doomed) is not None
    window.activateWindow()  # as the desktop does once the dialog has closed
    qtbot.waitUntil(lambda: sidebar.list.hasFocus(), timeout=1000)
    answer_next_dialog("Delete", seen)
    qtbot.keyClick(sidebar.list, Qt.Key.Key_Delete)
    assert chats.store.get(doomed) is None
    assert chats.current.title == "Keep this one" == window.chat.title.text()
    assert [c.title for c in chats.store.chats()] == ["Keep this one"]
    assert len(list(chats_dir.glob("*.json"))) == 1  # no chat made in its place
    assert sidebar.list.count() == 1 and sidebar.list.currentItem().text() == "Keep this one"
    chats.delete_chat(chats.current.id)  # the last one: a new, empty chat takes its place
    assert [c.title for c in chats.store.chats()] == ["New chat"]
    assert len(list(chats_dir.glob("*.json"))) == 1


def test_deleting_the_chat_a_reply_streams_into_frees_the_composer(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(script=["tok "] * 400, delay=0.01))
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    chats.send("A long answer, please")
    qtbot.waitUntil(lambda: chats.busy and bool(chats.current.turns[-1].content), timeout=2000)
    chats.delete_chat(chats.current.id)
    qtbot.waitUntil(lambda: not chats.busy, timeout=2000)
    assert panel.send_button.isEnabled() and not panel.stop_button.isEnabled()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        assert chats.send("Another question")


def test_the_search_box_answers_esc_and_enter(qtbot, make_window):
    load = FakeEngine.loader()
    window = make_window(loader=load)
    _load(qtbot, window)
    chats, sidebar = window.ctx.chats, window.sidebar
    for text in ("Plan a trip to Lisbon", "Bake bread"):
        chats.new_chat()
        with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
            chats.send(text)
    load.made[-1].script, load.made[-1].delay = ["tok "] * 400, 0.01  # a long reply next
    window.activateWindow()
    sidebar.search.setFocus()
    qtbot.waitUntil(lambda: sidebar.search.hasFocus(), timeout=1000)
    qtbot.keyClicks(sidebar.search, "lisbon")
    qtbot.waitUntil(lambda: sidebar.list.count() == 1, timeout=2000)
    assert chats.current.title == "Bake bread"
    qtbot.keyClick(sidebar.search, Qt.Key.Key_Return)  # Enter opens the chat found
    assert chats.current.title == "Plan a trip to Lisbon" and sidebar.list.hasFocus()
    sidebar.search.setFocus()
    qtbot.waitUntil(lambda: sidebar.search.hasFocus(), timeout=1000)
    chats.send("Go on")
    qtbot.waitUntil(lambda: chats.busy, timeout=1000)
    qtbot.keyClick(sidebar.search, Qt.Key.Key_Escape)  # clears the search, stops nothing
    assert sidebar.search.text() == "" and sidebar.list.count() == 2
    assert chats.busy
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=1000):
        qtbot.keyClick(sidebar.search, Qt.Key.Key_Escape)  # nothing to clear: Esc stops


def test_continue_is_offered_only_where_the_model_can_read_the_reply(qtbot, make_window):
    """Going on needs the reply so far as tokens: the demo engine (`snug --demo`), like a
    remote server, has no tokenizer here, so a reply it stopped offers no Continue."""
    from app.demo import demo_loader

    window = make_window(loader=demo_loader(delay=0.01))
    _load(qtbot, window)
    chats = window.ctx.chats
    chats.send("Tell me about the reserve")
    qtbot.waitUntil(lambda: len(chats.current.turns[-1].content) > 20, timeout=3000)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.stop()
    qtbot.waitUntil(lambda: not chats.busy, timeout=1000)
    assert chats.current.turns[-1].stats["finish_reason"] == "cancelled"
    assert not chats.can_continue() and not chats.continue_reply()
    assert window.chat.message_widgets()[-1].continue_button.isHidden()
    assert window.chat.regen_button.isEnabled()  # asking again still works
