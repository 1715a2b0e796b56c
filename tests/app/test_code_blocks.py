"""Each code block of a message copies alone: found as CommonMark finds fences
(app/code_blocks.py), with a "Copy code" link above it in the message view."""

from __future__ import annotations

from fake_engine import FakeEngine
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication

from app.code_blocks import code_blocks, with_copy_links
from app.engine_bridge import LoadRequest


def codes(markdown: str) -> list[str]:
    return [b.code for b in code_blocks(markdown)]


def test_fences_are_found_as_commonmark_reads_them():
    text = "Run:\n```bash\npip install x\n```\nthen\n~~~\nprint('```')\n~~~\n"
    assert codes(text) == ["pip install x", "print('```')"]
    # a longer fence holds shorter ones; its close is at least as long
    assert codes("````md\n```py\nx = 1\n```\n````") == ["```py\nx = 1\n```"]
    assert codes("  ```\n  indented\n    more\n ```") == ["indented\n  more"]
    assert codes("```\nstill streaming") == ["still streaming"]  # not closed yet
    assert codes("``` not`a fence\ntext") == []  # a backtick in a backtick fence's info
    assert codes("    ```\n    indented code, not a fence\n    ```") == []
    assert codes("no code here") == [] and codes("```\n```") == [""]


def test_a_link_goes_above_each_block_and_the_rest_is_unchanged():
    text = "Try this:\n```py\nx = 1\n```\nor\n```\ny\n```"
    linked, got = with_copy_links(text)
    assert got == ["x = 1", "y"]
    assert linked == (
        "Try this:\n\n[Copy code](snug-copy:0)\n```py\nx = 1\n```\nor\n\n"
        "[Copy code](snug-copy:1)\n```\ny\n```"
    )
    assert with_copy_links("plain") == ("plain", [])


def test_copy_code_puts_one_blocks_code_on_the_clipboard(qtbot, make_window, monkeypatch):
    script = ["Install it:\n\n", "```bash\n", "pip install snug\n", "```\n", "Then run `snug`."]
    window = make_window(loader=FakeEngine.loader(script=script))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("How do I install it?")
    view = window.chat.message_widgets()[-1].answer_view
    assert "Copy code" in view.toPlainText() and view.codes == ["pip install snug"]
    view.anchorClicked.emit(QUrl("snug-copy:0"))
    assert QGuiApplication.clipboard().text() == "pip install snug"
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url.toString()))
    view.anchorClicked.emit(QUrl("https://example.com/docs"))
    assert opened == ["https://example.com/docs"]  # other links still open in the browser
    view.anchorClicked.emit(QUrl("file:///usr/bin/xterm"))
    view.anchorClicked.emit(QUrl("smb://host/share"))
    assert opened == ["https://example.com/docs"]  # a model's file: link opens nothing


def test_html_in_a_message_is_shown_as_text(qtbot, make_window):
    """Angle brackets outside code are text, not HTML: a reply about `std::vector<int>`
    or `the <div> tag` keeps those words, and an <img> shows as written."""
    script = ["Use std::vector<int> here; the <div> tag; <b>not bold</b> ", '<img src="x.png">']
    window = make_window(loader=FakeEngine.loader(script=script))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("What is List<String>?")
    question, reply = window.chat.message_widgets()
    assert "List<String>" in question.answer_view.toPlainText()
    shown = reply.answer_view.toPlainText()
    assert "std::vector<int> here; the <div> tag; <b>not bold</b>" in shown
    assert '<img src="x.png">' in shown
