"""Chat streaming against the FakeEngine: responsiveness, Stop, errors, thinking, history."""

from __future__ import annotations

import threading
import time

import pytest
from fake_engine import THINKING_REPLY, FakeEngine
from PySide6.QtCore import QTimer

from app.engine_bridge import LoadRequest
from engine.errors import ScratchGrowFailed


def _load(qtbot, window):
    entry_dir = "/models/fake"
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest(entry_dir, window.ctx.settings.engine_settings(), 4096))


def test_message_streams_in_while_gui_stays_responsive(qtbot, make_window):
    loader = FakeEngine.loader(delay=0.01)
    window = make_window(loader=loader)
    _load(qtbot, window)
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(10)
    batches = []
    window.ctx.engine.tokens.connect(lambda _id, text, _count: batches.append(text))
    window.chat.input.setPlainText("Say hello")
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.chat.send_button.click()
    timer.stop()
    messages = window.chat.message_widgets()
    assert [m.property("role") for m in messages] == ["user", "assistant"]
    answer = messages[-1].answer_text()
    assert "Snug runs Qwen3.5" in answer and "fast" in answer  # markdown list rendered
    assert "**" not in answer
    assert len(ticks) >= 5, "the GUI thread must keep running timers during generation"
    assert max(b - a for a, b in zip(ticks, ticks[1:], strict=False)) < 0.1
    assert 1 < len(batches) < 13, "tokens arrive batched, not one signal per token"
    engine = loader.made[0]
    assert len(engine.threads) == 1 and threading.main_thread().ident not in engine.threads
    assert "tok/s" in messages[-1].stats_label.text()


def test_the_status_line_counts_a_streaming_replys_tokens_and_rate(qtbot, make_window):
    loader = FakeEngine.loader(delay=0.01, script=["word "] * 150)
    window = make_window(loader=loader)
    _load(qtbot, window)
    said = []
    window.ctx.chats.notice.connect(said.append)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        window.ctx.chats.send("Count")
    live = [t for t in said if t.startswith("Generating… ") and "tok/s" in t]
    assert live, said
    counts = [int(t.split()[1].replace(",", "")) for t in live]
    assert counts == sorted(counts) and 0 < counts[-1] <= 150
    rate = float(live[-1].split(" · ")[1].split()[0])
    assert 0 < rate < 1000  # at most one token every 10 ms on this engine, give or take
    assert "tok/s" in window.chat.status.text() and "Generating" not in window.chat.status.text()


def test_stop_ends_generation_within_200_ms(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(script=["tok "] * 500, delay=0.02))
    _load(qtbot, window)
    chats = window.ctx.chats
    window.chat.input.setPlainText("Count forever")
    got_tokens = []
    window.ctx.engine.tokens.connect(lambda *_a: got_tokens.append(1))
    window.chat.send()
    qtbot.waitUntil(lambda: len(got_tokens) >= 2, timeout=2000)
    start = time.monotonic()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=1000) as done:
        qtbot.keyClick(window.chat.input, "\x1b")  # Esc stops
        if chats.busy:
            window.chat.stop_button.click()
    assert time.monotonic() - start < 0.2
    assert done.args[1]["finish_reason"] == "cancelled"
    assert not chats.busy and window.chat.send_button.isEnabled()


def test_engine_error_reaches_the_chat_and_app_keeps_working(qtbot, make_window):
    loader = FakeEngine.loader(fail_with=ScratchGrowFailed("scratch could not grow to 2048 rows"))
    window = make_window(loader=loader)
    _load(qtbot, window)
    window.chat.input.setPlainText("A long prompt")
    with qtbot.waitSignal(window.ctx.engine.failed, timeout=3000):
        window.chat.send()
    qtbot.waitUntil(lambda: window.chat.message_widgets()[-1].property("role") == "error")
    error = window.chat.message_widgets()[-1]
    assert "ScratchGrowFailed" in error.answer_text()
    assert "2048 rows" in error.answer_text()
    assert window.ctx.engine.state == "ready"
    loader.made[0].fail_with = None  # the next request is served
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        assert window.ctx.chats.regenerate()
    roles = [m.property("role") for m in window.chat.message_widgets()]
    assert roles == ["user", "assistant"]


def test_thinking_is_collapsed_and_separate(qtbot, make_window, app_settings):
    window = make_window(loader=FakeEngine.loader(script=THINKING_REPLY))
    window.ctx.settings.set("chat/thinking", True)
    _load(qtbot, window)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("What is six times seven?")
    reply = window.chat.message_widgets()[-1]
    assert reply.answer_text() == "The answer is 42."
    assert not reply.think_toggle.isHidden() and reply.thinking_view.isHidden()
    assert "Let me think" in reply.thinking_view.toPlainText()
    reply.think_toggle.click()
    assert not reply.thinking_view.isHidden()


def test_history_is_saved_and_restored(qtbot, make_window, settings_store):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("First question")
    first_id = window.ctx.chats.current.id
    window.ctx.chats.new_chat()
    assert window.ctx.chats.current.id != first_id
    assert window.sidebar.list.count() == 2
    window.close()
    again = make_window(loader=FakeEngine.loader())
    titles = [again.sidebar.list.item(i).text() for i in range(again.sidebar.list.count())]
    assert "First question" in titles
    again.ctx.chats.select(first_id)
    roles = [m.property("role") for m in again.chat.message_widgets()]
    assert roles == ["user", "assistant"]


def test_keyboard_shortcuts(qtbot, make_window):
    from PySide6.QtCore import Qt

    window = make_window(loader=FakeEngine.loader(script=["tok "] * 400, delay=0.01))
    _load(qtbot, window)
    window.activateWindow()
    window.chat.input.setFocus()
    qtbot.waitUntil(lambda: window.chat.input.hasFocus(), timeout=1000)
    window.chat.input.setPlainText("Go")
    qtbot.keyClick(window.chat.input, Qt.Key.Key_Return)  # Enter sends
    qtbot.waitUntil(lambda: window.ctx.chats.busy, timeout=1000)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=1000):
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Escape)  # Esc stops
    with qtbot.waitSignal(window.ctx.engine.tokens, timeout=1000):  # Ctrl+Enter regenerates
        qtbot.keyClick(window.chat.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    window.ctx.chats.stop()
    qtbot.waitUntil(lambda: not window.ctx.chats.busy, timeout=1000)
    first = window.ctx.chats.current.id
    # Rebuilding the chat after a reply must keep the window active, or shortcuts stop.
    qtbot.keyClick(window.chat.input, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.ctx.chats.current.id != first


def test_enter_while_a_reply_streams_keeps_the_message_and_the_reply(qtbot, make_window):
    from PySide6.QtCore import Qt

    window = make_window(loader=FakeEngine.loader(script=["tok "] * 60, delay=0.01))
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    window.activateWindow()
    panel.input.setFocus()
    qtbot.waitUntil(lambda: panel.input.hasFocus(), timeout=1000)
    panel.input.setPlainText("First question")
    qtbot.keyClick(panel.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chats.busy and bool(chats.current.turns[-1].content), timeout=1000)
    first = chats.current.id
    panel.input.setPlainText("Typed while it answers")
    qtbot.keyClick(panel.input, Qt.Key.Key_Return)  # Send is greyed out: Enter waits too
    assert panel.input.toPlainText() == "Typed while it answers"
    assert [t.role for t in chats.current.turns] == ["user", "assistant"]
    assert not panel.send_button.isEnabled() and chats.busy
    chats.new_chat()  # another chat: its status line says where the reply goes
    assert panel.status.text() == "Answering “First question”: send once it ends (Esc stops it)."
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        pass
    reply = chats.store.get(first).turns[-1]
    assert reply.content == "tok " * 60 and reply.stats["finish_reason"] == "stop"
    assert panel.status.text() == ""  # the reply's stats are not this chat's
    chats.select(first)
    assert "60 tokens" in panel.message_widgets()[-1].stats_label.text()


def test_a_streaming_reply_is_saved_as_it_goes(qtbot, make_window, monkeypatch):
    """While a reply streams its chat file is written every SAVE_EVERY_S: a crash keeps
    what came so far (the file is otherwise written only at the reply's start and end)."""
    import json

    import app.chat_controller

    monkeypatch.setattr(app.chat_controller, "SAVE_EVERY_S", 0.05)
    window = make_window(loader=FakeEngine.loader(script=["word "] * 200, delay=0.01))
    _load(qtbot, window)
    chats = window.ctx.chats
    chats.send("Tell me a long story")
    path = chats.store.path(chats.current.id)

    def saved_reply() -> str:
        turns = json.loads(path.read_text(encoding="utf-8"))["turns"]
        return turns[-1]["content"] if turns[-1]["role"] == "assistant" else ""

    qtbot.waitUntil(lambda: saved_reply().startswith("word word"), timeout=3000)
    assert chats.busy  # saved mid-stream, not at the end
    chats.stop()
    qtbot.waitUntil(lambda: not chats.busy, timeout=3000)


@pytest.mark.parametrize("end_arrives", [True, False])
def test_closing_the_window_while_a_reply_streams_keeps_it_as_stopped(
    qtbot, make_window, monkeypatch, end_arrives
):
    """The reply under way when the window closes is saved as far as it came, as stopped
    (Continue offered), not left as it was at its last save; also where the engine's end
    of it never reaches the window (`end_arrives` False)."""
    import json

    from PySide6.QtCore import QCoreApplication

    if not end_arrives:
        monkeypatch.setattr(QCoreApplication, "sendPostedEvents", lambda *_a: None)
    window = make_window(loader=FakeEngine.loader(script=["word "] * 400, delay=0.01))
    _load(qtbot, window)
    chats = window.ctx.chats
    chats.send("Tell me a long story")
    qtbot.waitUntil(lambda: len(chats.current.turns[-1].content) >= 40, timeout=3000)
    shown, path = chats.current.turns[-1].content, chats.store.path(chats.current.id)
    window.close()
    reply = json.loads(path.read_text(encoding="utf-8"))["turns"][-1]
    assert reply["role"] == "assistant" and reply["content"].startswith(shown)
    assert reply["stats"]["finish_reason"] == "cancelled"
    again = make_window(loader=FakeEngine.loader())
    message = again.chat.message_widgets()[-1]
    assert message.answer_text().startswith("word word") and "stopped" in message.stats_label.text()


def test_a_slow_save_is_made_less_often_while_a_reply_streams(qtbot, make_window, monkeypatch):
    """Where a chat takes long to save (many attached files), the saves while a reply
    streams are spaced SAVE_SHARE times a save's time apart, so they take at most 2% of the
    thread the tokens are shown on; the reply is still saved whole at its end."""
    import app.chat_controller

    monkeypatch.setattr(app.chat_controller, "SAVE_EVERY_S", 0.0)
    window = make_window(loader=FakeEngine.loader(script=["word "] * 150, delay=0.01))
    _load(qtbot, window)
    chats = window.ctx.chats
    saves, real = [], chats.store.save

    def slow_save(chat):
        time.sleep(0.01)
        saves.append(time.monotonic())
        return real(chat)

    monkeypatch.setattr(chats.store, "save", slow_save)
    chats.send("Tell me a long story")
    qtbot.waitUntil(lambda: not chats.busy, timeout=10_000)
    mid = saves[:-1]  # the reply's start and the saves while it streamed, not its end
    gaps = [b - a for a, b in zip(mid, mid[1:], strict=False)]
    assert gaps and min(gaps) >= app.chat_controller.SAVE_SHARE * 0.01 * 0.9, gaps
    assert chats.current.turns[-1].content == "word " * 150


def test_a_message_the_chat_file_cannot_take_is_refused_and_kept(qtbot, make_window, monkeypatch):
    """A chat file is read back at start-up up to MAX_CHAT_BYTES: a message (its files
    too) that would take the file past it, with room for its reply, is not sent; the
    status line says to start a new chat, and the message stays in the box."""
    import app.state.chat_history as history

    window = make_window(loader=FakeEngine.loader(script=["Fine."]))
    _load(qtbot, window)
    chats, panel = window.ctx.chats, window.chat
    panel.input.setPlainText("hello")
    panel.send()
    qtbot.waitUntil(lambda: not chats.busy, timeout=3000)
    size = chats.store.path(chats.current.id).stat().st_size
    monkeypatch.setattr(history, "REPLY_BYTES", 1000)
    monkeypatch.setattr(history, "MAX_CHAT_BYTES", size + 1000 + 500)
    turns = len(chats.current.turns)
    panel.input.setPlainText("x" * 1000)
    panel.send()
    assert len(chats.current.turns) == turns and not chats.busy
    assert panel.input.toPlainText() == "x" * 1000
    assert "too long to take the message" in panel.status.text()
    panel.input.setPlainText("short")
    panel.send()
    assert len(chats.current.turns) == turns + 2  # a smaller one still fits
