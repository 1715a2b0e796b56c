"""Regenerate keeps the replies it replaces: the chat's last reply shows ‹ n / m ›, goes
through them, and the chat goes on from the one shown; they are kept across a restart."""

from __future__ import annotations

import json

from fake_engine import FakeEngine
from PySide6.QtCore import Qt

from app.engine_bridge import LoadRequest
from app.state.chat_store import ChatStore


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


def _reply(qtbot, window, loader, words: str, send: str | None = None) -> None:
    """The engine's next reply is `words`; `send` a message, else regenerate."""
    loader.made[-1].script = [words]
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        if send is None:
            window.chat.regen_button.click()
        else:
            window.chat.input.setPlainText(send)
            window.chat.send()


def _last(window):
    return window.chat.message_widgets()[-1]


def test_regenerate_keeps_each_reply_and_the_chat_goes_on_from_the_one_shown(qtbot, make_window):
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    _reply(qtbot, window, loader, "Paris.", send="Capital of France?")
    assert _last(window).prev_reply.isHidden()  # one reply: nothing to go through
    _reply(qtbot, window, loader, "It is Paris.")
    _reply(qtbot, window, loader, "Paris, of course.")
    reply = _last(window)
    assert reply.reply_count.text() == "3 / 3" and reply.answer_text() == "Paris, of course."
    assert reply.prev_reply.isEnabled() and not reply.next_reply.isEnabled()
    qtbot.mouseClick(reply.prev_reply, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(_last(window).prev_reply, Qt.MouseButton.LeftButton)
    reply = _last(window)
    assert reply.reply_count.text() == "1 / 3" and reply.answer_text() == "Paris."
    assert not reply.prev_reply.isEnabled() and reply.next_reply.isEnabled()
    qtbot.mouseClick(reply.next_reply, Qt.MouseButton.LeftButton)
    assert _last(window).answer_text() == "It is Paris."
    turns = window.ctx.chats.current.turns
    assert len(turns) == 2 and turns[-1].content == "It is Paris."
    # The next message reads the reply shown, and the earlier turn's ‹ › are gone.
    _reply(qtbot, window, loader, "About 2 million.", send="Population?")
    history = loader.made[-1].calls[-1]
    assert [m["content"] for m in history if m["role"] == "assistant"] == ["It is Paris."]
    first_reply = window.chat.message_widgets()[1]
    assert first_reply.prev_reply.isHidden() and first_reply.reply_count.isHidden()
    assert window.ctx.chats.show_reply(0) is False  # the last reply has no others


def test_the_replies_are_kept_across_a_restart_and_hidden_while_one_streams(
    qtbot, make_window, settings_store
):
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    _reply(qtbot, window, loader, "One.", send="Count")
    _reply(qtbot, window, loader, "Two.")
    loader.made[-1].script = ["Three", "."] * 200
    loader.made[-1].delay = 0.01
    window.chat.regen_button.click()
    turns = window.ctx.chats.current.turns
    qtbot.waitUntil(lambda: window.ctx.chats.busy and bool(turns[-1].content), timeout=2000)
    assert _last(window).prev_reply.isHidden()  # while it streams: no going through
    assert window.ctx.chats.show_reply(0) is False
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.stop()
    chat_id = window.ctx.chats.current.id
    window.ctx.chats.show_reply(0)
    window.close()
    again = make_window(loader=FakeEngine.loader(), store=settings_store)
    again.ctx.chats.select(chat_id)
    reply = _last(again)
    assert reply.answer_text() == "One." and reply.reply_count.text() == "1 / 3"
    assert [t.content for t in again.ctx.chats.current.turns[-1].others][0] == "Two."


def test_a_chat_files_kept_replies_are_checked_when_read(tmp_path):
    folder = tmp_path / "chats"
    folder.mkdir()
    turn = {"role": "assistant", "content": "b", "others": [{"role": "assistant", "content": "a"}]}
    bad = {"id": "aaaaaaaaaaaa", "turns": [{"role": "user", "content": "q"}, {**turn, "shown": 5}]}
    good = {"id": "bbbbbbbbbbbb", "turns": [{"role": "user", "content": "q"}, {**turn, "shown": 1}]}
    for chat in (bad, good):
        (folder / f"{chat['id']}.json").write_text(json.dumps(chat), "utf-8")
    store = ChatStore(folder)
    assert [c.id for c in store.chats()] == ["bbbbbbbbbbbb"]
    assert "turns[1].shown" in store.problems[0]
    kept = store.get("bbbbbbbbbbbb").turns[-1]
    assert kept.shown == 1 and [t.content for t in kept.others] == ["a"]


def test_a_regenerate_stopped_or_refused_before_its_first_word_gives_the_reply_back(
    qtbot, make_window
):
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    _reply(qtbot, window, loader, "One.", send="Count")
    _reply(qtbot, window, loader, "Two.")
    window.ctx.chats.show_reply(0)
    loader.made[-1].script = ["never"] * 50
    loader.made[-1].delay = 0.05
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.regenerate()
        window.ctx.chats.stop()  # before its first word
    turn = window.ctx.chats.current.turns[-1]
    assert (turn.content, turn.shown, [t.content for t in turn.others]) == ("One.", 0, ["Two."])
    loader.made[-1].fail_with = RuntimeError("out of memory")
    loader.made[-1].script = ["a"]  # it fails at its middle: here, before its first word
    with qtbot.waitSignal(window.ctx.engine.failed, timeout=3000):
        window.ctx.chats.regenerate()
    turns = window.ctx.chats.current.turns
    assert [t.role for t in turns] == ["user", "assistant", "error"]
    assert turns[1].content == "One." and [t.content for t in turns[1].others] == ["Two."]


def test_branch_starts_a_new_chat_from_a_message(qtbot, make_window, settings_store):
    """Branch on a message: a new chat with the conversation up to it (its system prompt,
    a reply's others), shown; the first chat is left as it was."""
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    chats = window.ctx.chats
    chats.store.set_system_prompt(chats.current.id, "Be brief.")
    _reply(qtbot, window, loader, "Paris.", send="Capital of France?")
    _reply(qtbot, window, loader, "It is Paris.")  # the first reply kept as another
    _reply(qtbot, window, loader, "About 2 million.", send="Population?")
    first = chats.current
    assert [t.content for t in first.turns][-1] == "About 2 million."
    qtbot.mouseClick(window.chat.message_widgets()[1].branch_button, Qt.MouseButton.LeftButton)
    branch = chats.current
    assert branch.id != first.id and branch.title == f"{first.title} (branch)"
    assert [t.content for t in branch.turns] == ["Capital of France?", "It is Paris."]
    assert [t.content for t in branch.turns[1].others] == ["Paris."]
    assert branch.system_prompt == "Be brief." and len(first.turns) == 4
    assert branch.turns[0] is not first.turns[0]  # its own: editing one leaves the other
    _reply(qtbot, window, loader, "Lyon is second.", send="And the second city?")
    assert len(chats.store.get(first.id).turns) == 4 and len(branch.turns) == 4
    assert not chats.branch(99)


def test_edit_on_an_earlier_message_changes_it_in_a_branch(qtbot, make_window):
    """Edit on one of the user's messages before the last: a new chat with the conversation
    before it (the system prompt too), the message and its files in the message box; the
    first chat stays as it was. On the chat's first message the branch holds no message."""
    from engine.attachments import Attachment

    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    chats.store.set_system_prompt(chats.current.id, "Be brief.")
    _reply(qtbot, window, loader, "Paris.", send="Capital of France?")
    _reply(qtbot, window, loader, "About 2 million.", send="Population?")
    _reply(qtbot, window, loader, "Lyon.", send="Second city?")
    first = chats.current
    first.turns[2].attachments = [Attachment("notes.txt", "census figures")]
    panel.input.setPlainText("a draft of the first chat")
    qtbot.mouseClick(panel.message_widgets()[2].edit_button, Qt.MouseButton.LeftButton)
    branch = chats.current
    assert branch.id != first.id and branch.title == f"{first.title} (branch)"
    assert [t.content for t in branch.turns] == ["Capital of France?", "Paris."]
    assert branch.system_prompt == "Be brief."
    assert panel.input.toPlainText() == "Population?"
    assert [a.name for a in panel.tray.files] == ["notes.txt"]
    assert len(chats.store.get(first.id).turns) == 6  # left as it was, its draft kept
    assert chats.store.get(first.id).draft == "a draft of the first chat"
    panel.input.setPlainText("Population of Paris with its suburbs?")
    loader.made[-1].script = ["About 11 million."]
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        panel.send()
    assert [t.content for t in branch.turns][2:] == [
        "Population of Paris with its suburbs?",
        "About 11 million.",
    ]
    assert branch.turns[2].attachments[0].name == "notes.txt"
    chats.select(first.id)
    qtbot.mouseClick(panel.message_widgets()[0].edit_button, Qt.MouseButton.LeftButton)
    fresh = chats.current
    assert fresh.id not in (first.id, branch.id) and fresh.turns == []
    assert fresh.system_prompt == "Be brief." and panel.input.toPlainText() == "Capital of France?"
