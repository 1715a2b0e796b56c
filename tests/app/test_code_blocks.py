"""Each code block of a message copies alone: found as CommonMark finds fences
(app/code_blocks.py), with a "Copy code" link above it in the message view; and it is
coloured by its language (app/highlight.py)."""

from __future__ import annotations

from fake_engine import FakeEngine
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor

from app import highlight, theme
from app.code_blocks import code_blocks, with_copy_links
from app.engine_bridge import LoadRequest


def codes(markdown: str) -> list[str]:
    return [b.code for b in code_blocks(markdown)]


def _answered(qtbot, make_window, script: list[str], message: str):
    """A window whose loaded stand-in engine has answered `message` with `script`."""
    window = make_window(loader=FakeEngine.loader(script=script))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send(message)
    return window


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
    window = _answered(qtbot, make_window, script, "How do I install it?")
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
    window = _answered(qtbot, make_window, script, "What is List<String>?")
    question, reply = window.chat.message_widgets()
    assert "List<String>" in question.answer_view.toPlainText()
    shown = reply.answer_view.toPlainText()
    assert "std::vector<int> here; the <div> tag; <b>not bold</b>" in shown
    assert '<img src="x.png">' in shown


def colours(view, text: str) -> list[str]:
    """The colour each character of the first `text` in `view` is drawn in."""
    doc = view.document()
    plain = doc.toPlainText()
    start = len(plain[: plain.index(text)].encode("utf-16-le")) // 2  # Qt counts UTF-16 units
    cursor = QTextCursor(doc)
    out = []
    for p in range(start, start + len(text)):
        cursor.setPosition(p + 1)  # the format of the character before the cursor
        out.append(cursor.charFormat().foreground().color().name())
    return out


def test_code_is_coloured_by_its_language(qtbot, make_window):
    """A fenced block naming its language is coloured by Pygments' lexer for it (keywords,
    strings and comments each in a colour of their own); a block naming none, or a language
    Pygments does not know, and the text around the blocks stay plain; the dark theme has
    colours of its own; a block still streaming in (no closing fence) is coloured too."""
    script = [
        "Here:\n\n```python\ndef area(r):\n    return 3.14 * r  # circle\n    print('hi')\n```\n",
        "\n```\ndef plain(): pass\n```\n\n```nosuchlanguage\ndef other(): pass\n```\n",
        "\ndef outside\n\n```python\nface = '🙂🙂'\nfor n in range(3): pass\n```\n",
        "\n```js\nconst x = 'hi';\n",
    ]
    window = _answered(qtbot, make_window, script, "Show me code")
    view = window.chat.message_widgets()[-1].answer_view
    text = colours(view, "Here:")[0]
    keyword, name = colours(view, "def area")[0], colours(view, "area(r)")[0]
    string, comment = colours(view, "'hi'")[0], colours(view, "# circle")[0]
    assert len({text, keyword, name, string, comment}) == 5
    assert set(colours(view, "def area")[:3]) == {keyword}
    assert set(colours(view, "return")) == {keyword}
    assert set(colours(view, "# circle")) == {comment}
    for plain in ("def plain(): pass", "def other(): pass", "def outside"):
        assert set(colours(view, plain)) == {text}
    assert colours(view, "const")[0] != text  # the open block at the end
    # After characters past U+FFFF (two UTF-16 units each in the document) the colours
    # still fall on their words.
    assert set(colours(view, "for n in")[:3]) == {keyword} and colours(view, "n in")[0] == text
    light = (keyword, string)
    theme.apply("dark")
    try:
        view = window.chat.message_widgets()[-1].answer_view
        dark = (colours(view, "def area")[0], colours(view, "'hi'")[0])
        assert dark != light and len(set(dark)) == 2
    finally:
        theme.apply("light")


def test_a_code_block_past_the_limit_stays_plain():
    long = "x = 1\n" * (highlight.MAX_CHARS // 6 + 1)
    assert highlight.runs("python", long, False) == ()
    assert highlight.runs("python", long[: highlight.MAX_CHARS - 6], False)
    assert highlight.runs("Python  {.numberLines}", "x = 1", True)  # its first word names it
    assert highlight.runs("", "x = 1", False) == () == highlight.runs("zzz", "x = 1", False)
