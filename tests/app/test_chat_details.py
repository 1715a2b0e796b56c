"""Issue 28, item 9: Regenerate in an empty chat, stats of the chat left behind, the thought
label with thinking off, and `snug --version`."""

from __future__ import annotations

import re

from fake_engine import FakeEngine
from PySide6.QtCore import Qt

from app.engine_bridge import LoadRequest


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


def _send(qtbot, window, text: str) -> None:
    window.chat.input.setFocus()
    qtbot.keyClicks(window.chat.input, text)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        qtbot.mouseClick(window.chat.send_button, Qt.MouseButton.LeftButton)


def test_regenerate_is_off_in_an_empty_chat(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    assert not window.ctx.chats.current.turns
    assert not window.chat.regen_button.isEnabled()
    _send(qtbot, window, "Hi")
    assert window.chat.regen_button.isEnabled()
    qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
    assert not window.chat.regen_button.isEnabled()


def test_a_new_chat_does_not_show_the_last_chats_stats(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    _send(qtbot, window, "Hi")
    assert "tok/s" in window.chat.status.text()
    qtbot.mouseClick(window.sidebar.new_button, Qt.MouseButton.LeftButton)
    assert window.ctx.chats.current.turns == []
    assert "tok/s" not in window.chat.status.text()


def test_no_thought_label_with_thinking_off(qtbot, make_window):
    stray = ["Sure", "</think>", "\n\n", "The answer", " is", " 42", "."]
    window = make_window(loader=FakeEngine.loader(script=stray))
    assert window.ctx.settings.thinking is False
    _load(qtbot, window)
    _send(qtbot, window, "What is six times seven?")
    reply = window.chat.message_widgets()[-1]
    assert reply.think_toggle.isHidden(), reply.think_toggle.text()
    assert "42" in reply.answer_text() and "think" not in reply.answer_text()


def test_one_word_of_thinking_is_one_word(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(script=["Hmm", "</think>", "Yes."]))
    _load(qtbot, window)  # the chat replaces the first-run view once a model is loaded
    qtbot.mouseClick(window.chat.thinking, Qt.MouseButton.LeftButton)
    assert window.ctx.settings.thinking is True
    _send(qtbot, window, "Sure?")
    label = window.chat.message_widgets()[-1].think_toggle.text()
    assert re.fullmatch(r"Thought for \d\.\d s \(1 word\)", label), label


def test_the_thought_label_says_how_long_the_reply_thought(qtbot, make_window):
    """The reply's seconds from its first token to its `</think>` (kept in its stats), said
    above the answer; a reply gone on with says its words only."""
    from app.widgets.message import _duration

    script = ["Let", " me", " see", "</think>", "Yes."]
    window = make_window(loader=FakeEngine.loader(script=script, delay=0.05))
    _load(qtbot, window)
    window.ctx.settings.set("chat/thinking", True)
    _send(qtbot, window, "Sure?")
    turn = window.ctx.chats.current.turns[-1]
    assert 0.1 <= turn.stats["thinking_s"] < 5  # three tokens of 50 ms before the close
    label = window.chat.message_widgets()[-1].think_toggle.text()
    assert label == f"Thought for {_duration(turn.stats['thinking_s'])} (3 words)"
    assert (_duration(3.24), _duration(41.4), _duration(125)) == ("3.2 s", "41 s", "2 min 5 s")


def test_version_prints_the_version_and_starts_no_window(capsys, monkeypatch):
    from importlib.metadata import version

    import app.main
    from app import entry

    def no_gui(*_a, **_k):
        raise AssertionError("--version started the GUI")

    monkeypatch.setattr(app.main, "main", no_gui)
    assert entry.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"snug {version('snug')}"


def test_the_stats_line_says_how_many_drafts_were_kept():
    """A drafted reply's stats (the engine's counts, through the worker's summary) end the
    message's stats line with the drafts kept; a reply without drafts says nothing of them."""
    from types import SimpleNamespace

    from app.chat_controller import format_stats
    from app.workers.engine_worker import _summary
    from engine.session import GenerationStats

    stats = GenerationStats(12, 40, 0.2, 60.0, 55.0, drafted=30, drafts_kept=24)
    summary = _summary(SimpleNamespace(stats=stats, finish_reason="stop"), None)
    assert (summary["drafted"], summary["drafts_kept"]) == (30, 24)
    assert format_stats(summary).endswith(" · 24 of 30 drafts kept")
    plain = _summary(
        SimpleNamespace(stats=GenerationStats(12, 40, 0.2, 60.0, 55.0), finish_reason="stop"), None
    )
    assert "draft" not in format_stats(plain)


def test_a_reply_still_thinking_counts_its_seconds(qtbot, make_window):
    script = ["Let"] + [" me see"] * 30 + ["</think>", "Yes."]
    window = make_window(loader=FakeEngine.loader(script=script, delay=0.05))
    _load(qtbot, window)
    window.ctx.settings.set("chat/thinking", True)
    labels = []
    window.ctx.engine.tokens.connect(
        lambda *_a: labels.append(window.chat.message_widgets()[-1].think_toggle.text())
    )
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=5000):
        window.ctx.chats.send("Sure?")
    live = [t for t in labels if t.startswith("Thinking… ")]
    assert live and re.fullmatch(r"Thinking… \d+ s", live[-1]), labels[-3:]
    assert window.chat.message_widgets()[-1].think_toggle.text().startswith("Thought for ")


def test_a_reply_stopped_while_it_thinks_is_not_said_to_think_still(qtbot, make_window):
    """A reply stopped (or cut by the token limit) inside its thinking has ended: its label
    says so, not "Thinking…", and says so again when its chat is shown again."""
    window = make_window(loader=FakeEngine.loader(script=["hmm "] * 400, delay=0.01))
    _load(qtbot, window)
    window.ctx.settings.set("chat/thinking", True)
    chats = window.ctx.chats
    chats.send("Think hard")
    qtbot.waitUntil(lambda: chats.current.turns[-1].content.count("hmm") >= 3, timeout=3000)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.stop()
    asked = chats.current.id
    words = len(chats.current.turns[-1].content.split())
    label = f"Thinking cut short ({words} words)"
    assert window.chat.message_widgets()[-1].think_toggle.text() == label
    chats.new_chat()
    chats.select(asked)
    assert window.chat.message_widgets()[-1].think_toggle.text() == label
    exported = chats.current.markdown()  # its thinking, and no empty answer after it
    assert exported.endswith("hmm\n\n</details>\n") and "\n\n\n" not in exported
