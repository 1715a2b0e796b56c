"""Issue 28, items 1 and 10: numbers typed into Settings are stored as typed, within the
bounds the engine accepts, and a request the engine refuses is said, not half-saved."""

from __future__ import annotations

from fake_engine import FakeEngine
from PySide6.QtCore import Qt

from app import engine_bridge
from app.engine_bridge import LoadRequest


def _type(qtbot, spin, text: str, enter: bool = False) -> None:
    """Select the box's text and type over it, as a user does."""
    spin.setFocus()
    qtbot.keyClick(spin, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(spin, text)
    if enter:
        qtbot.keyClick(spin, Qt.Key.Key_Return)


def test_typed_decimals_are_stored_as_typed(qtbot, make_window):
    window = make_window()
    window.tabs.setCurrentWidget(window.settings)
    editors, s = window.settings.editors, window.ctx.settings
    _type(qtbot, editors["memory/reserve_gib"], "1.25")
    assert s.get("memory/reserve_gib") == 1.25
    _type(qtbot, editors["sampling/temperature"], "0.5")
    assert s.get("sampling/temperature") == 0.5
    _type(qtbot, editors["sampling/top_p"], "0.95")
    assert s.get("sampling/top_p") == 0.95
    assert editors["sampling/top_p"].text() == "0.95"
    # The arrow keys still step from the typed value.
    qtbot.keyClick(editors["sampling/temperature"], Qt.Key.Key_Up)
    assert s.get("sampling/temperature") == 0.55


def test_sampling_boxes_keep_to_what_the_engine_accepts(qtbot, make_window):
    window = make_window()
    window.tabs.setCurrentWidget(window.settings)
    editors, s = window.settings.editors, window.ctx.settings
    _type(qtbot, editors["sampling/top_p"], "0", enter=True)
    assert 0 < s.get("sampling/top_p") <= 1
    _type(qtbot, editors["sampling/min_p"], "1", enter=True)
    assert 0 <= s.get("sampling/min_p") < 1
    for _ in range(5):
        qtbot.keyClick(editors["sampling/top_p"], Qt.Key.Key_Down)
    assert s.get("sampling/top_p") > 0
    engine_bridge.make_params(s.sampling())  # the engine takes every value the boxes allow


def test_a_refused_request_is_said_and_leaves_no_empty_reply(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    # A settings file from before the bounds (or edited by hand) holds top_p = 0.
    window.ctx.settings.store.setValue("sampling/top_p", 0.0)
    chats = window.ctx.chats
    window.chat.input.setFocus()
    qtbot.keyClicks(window.chat.input, "Hello")
    qtbot.mouseClick(window.chat.send_button, Qt.MouseButton.LeftButton)
    assert "top_p" in window.chat.status.text() and "Settings" in window.chat.status.text()
    assert window.chat.input.toPlainText() == "Hello", "the message stays in the composer"
    assert not chats.busy and window.ctx.engine.state == "ready"
    saved = chats.store.get(chats.current.id)
    assert not any(t.role == "assistant" and not t.content for t in saved.turns)
    chats.store.load_all()  # and on disk
    again = chats.store.get(chats.current.id)
    assert again is None or not any(t.role == "assistant" and not t.content for t in again.turns)


def test_max_rows_auto_reads_as_auto_and_reaches_the_engine_as_none(qtbot, make_window):
    """0, the default, shows as "Auto" in Settings and the load panel, and a load made from
    the stored settings asks the engine for the plan's choice (max_rows None); a number
    typed in is asked for as typed."""
    window = make_window()
    s, editors = window.ctx.settings, window.settings.editors
    assert s.max_rows == 0 and editors["engine/max_rows"].text() == "Auto"
    assert window.load.rows_spin.text() == "Auto"
    assert LoadRequest("/m", s.engine_settings(), 4096, 1, s.max_rows).max_rows is None
    _type(qtbot, editors["engine/max_rows"], "1024")
    assert s.max_rows == 1024 and window.load.rows_spin.value() == 1024
    assert LoadRequest("/m", s.engine_settings(), 4096, 1, s.max_rows).max_rows == 1024


def test_restore_defaults_asks_before_it_wipes_the_settings(qtbot, make_window):
    from helpers import answer_next_dialog

    window = make_window()
    window.tabs.setCurrentWidget(window.settings)
    s = window.ctx.settings
    window.settings.editors["chat/system_prompt"].setPlainText("Answer in French.")
    window.settings.editors["sampling/temperature"].setValue(0.3)
    seen: list[str] = []
    answer_next_dialog("Cancel", seen)
    window.settings.reset_button.click()
    assert "Put every setting back to its default?" in seen
    assert s.system_prompt == "Answer in French." and s.get("sampling/temperature") == 0.3
    answer_next_dialog("Restore defaults", seen)
    window.settings.reset_button.click()
    assert s.system_prompt != "Answer in French." and s.get("sampling/temperature") == 0.7
    assert window.settings.editors["sampling/temperature"].value() == 0.7


def _focus(qtbot, widget) -> None:
    widget.setFocus()
    qtbot.waitUntil(widget.hasFocus, timeout=1000)


def _clear(qtbot, spin) -> None:
    """Select the box's text and delete it, as a user does."""
    qtbot.keyClick(spin, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(spin, Qt.Key.Key_Delete)
    assert spin.text() == spin.prefix() + spin.suffix()


def test_a_number_box_left_empty_keeps_its_value(qtbot, make_window):
    """A box cleared and left (focus moves on, or Enter) shows and stores the value it had
    before, not its minimum: "Max new tokens" 16 cut every reply short."""
    window = make_window()
    window.tabs.setCurrentWidget(window.settings)
    window.activateWindow()
    editors, s = window.settings.editors, window.ctx.settings
    elsewhere = editors["chat/system_prompt"]
    stored: list[tuple[str, object]] = []
    s.changed.connect(lambda key, value: stored.append((key, value)))
    for key in (
        "sampling/max_new_tokens",
        "engine/context",
        "sampling/temperature",
        "sampling/top_p",
        "engine/max_rows",
    ):
        spin, before = editors[key], s.get(key)
        shown = spin.text()
        for leave in ("focus", "enter"):
            _focus(qtbot, spin)
            _clear(qtbot, spin)
            with qtbot.waitSignal(spin.editingFinished, timeout=1000):
                if leave == "enter":
                    qtbot.keyClick(spin, Qt.Key.Key_Return)
                else:
                    _focus(qtbot, elsewhere)
            assert (key, leave, spin.text(), s.get(key)) == (key, leave, shown, before)
        # Nothing else on the way (Enter stores the value shown, which is this one).
        assert {v for k, v in stored if k == key} <= {before}, key


def test_an_emptied_box_goes_back_to_before_the_edit(qtbot, make_window):
    """Digits typed and then erased (stored as typed on the way) leave the value from before
    the edit; so does a value set from elsewhere, and the Load tab's boxes do the same."""
    window = make_window()
    window.tabs.setCurrentWidget(window.settings)
    window.activateWindow()
    editors, s = window.settings.editors, window.ctx.settings
    elsewhere = editors["chat/system_prompt"]
    context = editors["engine/context"]
    before = s.context
    _focus(qtbot, context)
    _type(qtbot, context, "3000")
    assert s.context == 3000
    for _ in range(4):
        qtbot.keyClick(context, Qt.Key.Key_Backspace)
    _focus(qtbot, elsewhere)
    assert s.context == before and context.value() == before
    # Restore defaults sets the boxes with their signals blocked.
    temperature = editors["sampling/temperature"]
    s.set("sampling/temperature", 0.3)
    s.reset()
    _focus(qtbot, temperature)
    _clear(qtbot, temperature)
    _focus(qtbot, elsewhere)
    assert s.get("sampling/temperature") == 0.7 and temperature.text() == "0.70"

    window.tabs.setCurrentWidget(window.load)
    spin = window.load.context_spin
    _focus(qtbot, spin)
    _type(qtbot, spin, "3000")
    for _ in range(4):
        qtbot.keyClick(spin, Qt.Key.Key_Backspace)
    _focus(qtbot, window.load.streams_spin)
    assert spin.value() == before and s.context == before and spin.text() == f"{before} tokens"
