"""Continue and the reply variants with the thinking's figures: a reply gone on with keeps
how long it thought and the budget that closed its thinking, counts the context it used
once, and closes the budget's words once where the token limit cut them; the status line
speaks of the reply shown. Each as the saved chat has it after a restart."""

from __future__ import annotations

from fake_engine import THINKING_REPLY, FakeEngine
from PySide6.QtCore import Qt

from app.engine_bridge import LoadRequest
from app.state.chat_history import Turn
from app.thinking import split_reply
from engine.thinking_budget import CLOSE


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


def test_continue_keeps_the_thinking_figures_and_counts_the_context_once(
    qtbot, make_window, settings_store
):
    loader = FakeEngine.loader(script=THINKING_REPLY)
    window = make_window(loader=loader)
    settings = window.ctx.settings
    settings.set("chat/thinking", True)
    settings.set("sampling/max_new_tokens", 6)  # cut in the answer, after the thinking
    _load(qtbot, window)
    chats = window.ctx.chats
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        assert chats.send("What is the answer?")
    turn = chats.current.turns[-1]
    thought = turn.stats["thinking_s"]
    assert turn.stats["finish_reason"] == "length" and thought >= 0
    turn.stats["thinking_cut"] = 3  # as a reply whose thinking the budget closed has it
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        assert chats.continue_reply()
    turn = chats.current.turns[-1]
    assert turn.stats["new_tokens"] == 12
    assert turn.stats["thinking_s"] == thought and turn.stats["thinking_cut"] == 3
    # The engine read the prompt and the reply so far, then wrote 6 tokens: that is what
    # the reply takes of the context, the first 6 tokens counted once.
    read = len(loader.made[-1].prompts[-1])
    assert f"{read + 6:,} of 4,096 tokens of context" in window.chat.status.text()
    assert "thinking closed at its budget of 3 tokens" in window.chat.status.text()
    assert window.chat.message_widgets()[-1].think_toggle.text().startswith("Thought for")
    window.close()
    again = make_window(loader=FakeEngine.loader(), store=settings_store)
    reply = again.chat.message_widgets()[-1]
    assert reply.think_toggle.text().startswith("Thought for")
    assert "thinking closed at its budget of 3 tokens" in reply.stats_label.text()
    assert "12 tokens" in reply.stats_label.text()


def test_continue_closes_the_budgets_words_once_where_the_limit_cut_them(
    qtbot, make_window, settings_store
):
    """The token limit fell inside the words the thinking budget closes the thinking with:
    Continue puts in the rest of them, not the words again from their start, and the
    answer follows the closed thinking."""
    loader = FakeEngine.loader(script=["The", " answer", "."])
    window = make_window(loader=loader)
    window.ctx.settings.set("chat/thinking", True)
    _load(qtbot, window)
    chats = window.ctx.chats
    cut = "Some thought" + CLOSE[:30]
    stats = {"finish_reason": "length", "new_tokens": 14, "thinking_cut": 8}
    chats.current.turns += [Turn("user", "Hi"), Turn("assistant", cut, True, stats)]
    chats.turns_changed.emit(chats.current.id)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        assert chats.continue_reply()
    content = chats.current.turns[-1].content
    assert content == "Some thought" + CLOSE + "The answer."
    split = split_reply(content, True)
    assert split.thinking_done and split.answer == "The answer."
    window.close()
    again = make_window(loader=FakeEngine.loader(), store=settings_store)
    reply = again.chat.message_widgets()[-1]
    assert reply.answer_text() == "The answer."
    assert "thinking closed at its budget of 8 tokens" in reply.stats_label.text()


def test_the_status_line_follows_the_reply_shown(qtbot, make_window):
    """‹ › through the replies Regenerate kept: the status line's figures are the shown
    reply's, not those of the last one written."""
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    loader.made[-1].script = ["Paris", "."]
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("Capital of France?")
    loader.made[-1].script = ["It", " is", " Paris", "."]
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.chat.regen_button.click()
    assert window.chat.status.text().startswith("4 tokens")
    qtbot.mouseClick(window.chat.message_widgets()[-1].prev_reply, Qt.MouseButton.LeftButton)
    assert window.chat.status.text().startswith("2 tokens"), window.chat.status.text()
    qtbot.mouseClick(window.chat.message_widgets()[-1].next_reply, Qt.MouseButton.LeftButton)
    assert window.chat.status.text().startswith("4 tokens")


def test_a_reply_that_filled_the_context_says_so_not_the_token_limit(
    qtbot, make_window, settings_store
):
    """A reply cut where the context ends says it filled the context (which a larger one
    on the Load tab mends); one cut by Max new tokens still says the token limit. As the
    saved chat has it after a restart, too."""
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    window.ctx.settings.set("sampling/max_new_tokens", 6)
    _load(qtbot, window)
    chats = window.ctx.chats
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        assert chats.send("Hello there")
    assert "hit the token limit" in window.chat.status.text()
    read = len(loader.made[-1].prompts[-1])
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):  # a context it fills
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), read + 6))
    chats.new_chat()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        assert chats.send("Hello there")
    status = window.chat.status.text()
    assert "filled the context" in status and "token limit" not in status, status
    assert f"{read + 6:,} of {read + 6:,} tokens of context" in status
    assert chats.current.turns[-1].stats["filled_context"] == read + 6
    window.close()
    again = make_window(loader=FakeEngine.loader(), store=settings_store)
    assert "filled the context" in again.chat.message_widgets()[-1].stats_label.text()
