"""A chat's own system prompt: sent in place of the settings' one, kept with the chat (its
place in the list too), set in the title's dialog, and back to the default when asked."""

from __future__ import annotations

import json

from fake_engine import FakeEngine

from app.engine_bridge import LoadRequest
from app.widgets.system_prompt import SystemPromptDialog


def _load(qtbot, window, loader):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    return loader.made[-1]


def _send(qtbot, window, text):
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send(text)


def test_a_chats_own_prompt_goes_in_place_of_the_default(qtbot, make_window, monkeypatch):
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    engine = _load(qtbot, window, loader)
    chats, panel = window.ctx.chats, window.chat
    default = window.ctx.settings.system_prompt
    _send(qtbot, window, "Hello")
    first = chats.current.id
    assert engine.calls[-1][0] == {"role": "system", "content": default}
    button = panel.system_button
    assert button.text() == "System prompt" and default in button.toolTip()

    def answer(dialog):  # what a person types in the dialog
        dialog.use_default.setChecked(False)
        dialog.edit.setPlainText("  Talk like a pirate.  ")
        return SystemPromptDialog.DialogCode.Accepted

    monkeypatch.setattr(SystemPromptDialog, "exec", answer)
    chats.new_chat()
    _send(qtbot, window, "Second chat")
    chats.select(first)
    order = [c.id for c in chats.store.chats()]
    panel.edit_system_prompt()
    assert panel.system_button.text() == "System prompt (this chat)"
    assert [c.id for c in chats.store.chats()] == order  # its place in the list stays
    _send(qtbot, window, "Ahoy?")
    assert engine.calls[-1][0] == {"role": "system", "content": "Talk like a pirate."}
    saved = json.loads(chats.store.path(first).read_text(encoding="utf-8"))
    assert saved["system_prompt"] == "Talk like a pirate."
    assert "*System prompt:* Talk like a pirate." in chats.current.markdown()
    chats.store.set_system_prompt(first, "")  # its own: none at all
    _send(qtbot, window, "And now?")
    assert engine.calls[-1][0]["role"] == "user"
    others = [c for c in chats.store.chats() if c.id != first]
    assert all(c.system_prompt is None for c in others)  # the other chat keeps the default

    def back_to_default(dialog):
        dialog.use_default.setChecked(True)
        return SystemPromptDialog.DialogCode.Accepted

    monkeypatch.setattr(SystemPromptDialog, "exec", back_to_default)
    panel.edit_system_prompt()
    assert chats.current.system_prompt is None and panel.system_button.text() == "System prompt"
    window.close()
    again = make_window(loader=FakeEngine.loader())
    assert again.ctx.chats.store.get(first).system_prompt is None


def test_the_dialog_shows_the_default_or_the_chats_own(qtbot):
    own = SystemPromptDialog("Be brief.", "You are a helpful assistant.")
    qtbot.addWidget(own)
    assert not own.use_default.isChecked() and own.edit.toPlainText() == "Be brief."
    assert own.prompt() == "Be brief."
    own.use_default.setChecked(True)  # the default shown, not editable, and chosen
    assert own.edit.isReadOnly() and own.edit.toPlainText() == "You are a helpful assistant."
    assert own.prompt() is None
    default = SystemPromptDialog(None, "Default prompt")
    qtbot.addWidget(default)
    assert default.use_default.isChecked() and default.prompt() is None
    default.use_default.setChecked(False)
    default.edit.setPlainText("")
    assert default.prompt() == ""  # its own: none at all


def test_a_prompt_typed_in_the_dialog_comes_back_with_its_own_box(qtbot):
    """Ticking "Use the default" shows the default; unticking it again brings back what the
    chat's own prompt held, typed or kept, not the default to type it over again."""
    dialog = SystemPromptDialog(None, "You are a helpful assistant.")
    qtbot.addWidget(dialog)
    dialog.use_default.setChecked(False)
    assert dialog.edit.toPlainText() == "You are a helpful assistant."  # a start to change
    dialog.edit.setPlainText("Talk like a ship's captain.\nKeep it short.")
    dialog.use_default.setChecked(True)
    assert dialog.edit.toPlainText() == "You are a helpful assistant." and dialog.prompt() is None
    dialog.use_default.setChecked(False)
    assert dialog.edit.toPlainText() == "Talk like a ship's captain.\nKeep it short."
    assert dialog.prompt() == "Talk like a ship's captain.\nKeep it short."
    own = SystemPromptDialog("Be brief.", "Default prompt")
    qtbot.addWidget(own)
    own.use_default.setChecked(True)
    own.use_default.setChecked(False)
    assert own.prompt() == "Be brief."
