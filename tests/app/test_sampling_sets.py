"""Two sampling sets, as Qwen3.5's model cards recommend: one for replies without thinking
(Settings > Sampling) and one for replies that think first (Settings > Sampling while
thinking). Each reply is drawn with its mode's set; Continue goes on with the set its
reply was written with."""

from __future__ import annotations

from fake_engine import FakeEngine
from PySide6.QtCore import Qt

from app.engine_bridge import LoadRequest
from app.state.settings import AppSettings


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


def _knobs(params) -> tuple:
    return (params.temperature, params.top_p, params.top_k, params.presence_penalty, params.min_p)


def test_the_two_sets_default_to_the_model_cards(settings_store):
    s = AppSettings(settings_store)
    plain, thinking = s.sampling(), s.sampling(thinking=True)
    knobs = ("temperature", "top_p", "top_k", "presence_penalty", "min_p")
    assert tuple(plain[k] for k in knobs) == (0.7, 0.8, 20, 1.5, 0.0)
    assert tuple(thinking[k] for k in knobs) == (1.0, 0.95, 20, 1.5, 0.0)
    assert plain["max_new_tokens"] == thinking["max_new_tokens"] == 2048


def test_each_reply_is_drawn_with_its_modes_set(qtbot, make_window):
    load = FakeEngine.loader(script=["one ", "two ", "three "])
    window = make_window(loader=load)
    s = window.ctx.settings
    editors = window.settings.editors
    editors["thinking_sampling/temperature"].setValue(0.6)  # the panel saves it
    editors["thinking_sampling/presence_penalty"].setValue(0.0)
    assert s.get("thinking_sampling/temperature") == 0.6
    s.set("sampling/top_k", 40)
    s.set("sampling/max_new_tokens", 2)
    _load(qtbot, window)
    chats, engine = window.ctx.chats, load.made[-1]
    s.set("chat/thinking", False)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Count")
    assert _knobs(engine.params[-1]) == (0.7, 0.8, 40, 1.5, 0.0)
    s.set("chat/thinking", True)
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Count again")
    assert _knobs(engine.params[-1]) == (0.6, 0.95, 20, 0.0, 0.0)
    assert engine.params[-1].max_new_tokens == 2
    # Continue, with the box turned off since: the reply thought, so it goes on as it began.
    s.set("chat/thinking", False)
    reply = window.chat.message_widgets()[-1]
    assert not reply.continue_button.isHidden()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        qtbot.mouseClick(reply.continue_button, Qt.MouseButton.LeftButton)
    assert _knobs(engine.params[-1]) == (0.6, 0.95, 20, 0.0, 0.0)


def test_a_bad_value_in_the_thinking_set_names_its_group(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    s = window.ctx.settings
    s.store.setValue("thinking_sampling/top_p", 0.0)  # a file edited by hand
    s.set("chat/thinking", True)
    said: list[str] = []
    window.ctx.chats.refused.connect(said.append)
    assert not window.ctx.chats.send("Hello")
    assert said and "Settings > Sampling while thinking" in said[0]
    s.set("chat/thinking", False)  # the other set is fine: the message goes
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        assert window.ctx.chats.send("Hello")
