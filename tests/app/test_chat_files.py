"""Files attached to a message in the app: chosen, dropped or pasted on the composer, read on
a thread, sent before the message's text, kept with the chat, refused by name."""

from __future__ import annotations

import json

from fake_engine import FakeEngine
from PySide6.QtCore import QMimeData, Qt, QUrl
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel, QWidget

from app.engine_bridge import LoadRequest
from engine.testing.documents import text_pdf


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


def _files(*paths) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


def chips(panel) -> list[str]:
    """The files the tray shows (chips still on screen)."""
    shown = panel.tray.findChildren(QWidget, "attachmentChip")
    return [c.findChild(QLabel).text() for c in shown if c.isVisibleTo(panel)]


def _attach(qtbot, panel, *paths):
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000) as done:
        panel.tray.add([str(p) for p in paths])
    return done.args[0]


def test_files_go_before_the_message_and_stay_with_the_chat(qtbot, make_window, tmp_path):
    (tmp_path / "notes.md").write_text("buy milk\ncall Ann\n", encoding="utf-8")
    (tmp_path / "report.pdf").write_bytes(text_pdf(["Quarterly totals: 42"]))
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    panel, chats = window.chat, window.ctx.chats
    assert _attach(qtbot, panel, tmp_path / "notes.md", tmp_path / "report.pdf") == []
    assert [a.name for a in panel.tray.files] == ["notes.md", "report.pdf"]
    assert chips(panel) == ["notes.md, 2 lines", "report.pdf, 1 line"]
    panel.input.setPlainText("What should I do first?")
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        panel.send()
    assert panel.tray.files == [] and panel.tray.isHidden() and panel.input.toPlainText() == ""
    assert chips(panel) == []
    asked = loader.made[-1].calls[-1][-1]["content"]
    assert asked == (
        "File: notes.md\n```markdown\nbuy milk\ncall Ann\n```\n\n"
        "File: report.pdf\n```\nQuarterly totals: 42\n```\n\n"
        "What should I do first?"
    )
    question = window.chat.message_widgets()[-2]
    label = question.attachments_label
    assert not label.isHidden() and "notes.md, 2 lines" in label.text()
    assert "report.pdf, 1 line" in label.text() and "buy milk" in label.toolTip()
    qtbot.mouseClick(question.copy_button, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == asked  # Copy gives what the model read
    saved = json.loads(chats.store.path(chats.current.id).read_text(encoding="utf-8"))
    first = saved["turns"][0]
    assert first["content"] == "What should I do first?"
    assert [a["name"] for a in first["attachments"]] == ["notes.md", "report.pdf"]
    assert "Quarterly totals: 42" in chats.current.markdown()
    window.sidebar.search.setText("REPORT.PDF")  # found by a file's name
    qtbot.waitUntil(lambda: window.sidebar.list.count() == 1, timeout=2000)
    window.close()
    again = make_window(loader=FakeEngine.loader())
    shown = again.chat.message_widgets()[0]
    assert "notes.md, 2 lines" in shown.attachments_label.text()


def test_a_file_dropped_or_pasted_on_the_composer_is_attached_not_typed(
    qtbot, make_window, tmp_path
):
    path = tmp_path / "main.py"
    path.write_text("print('hi')\n", encoding="utf-8")
    window = make_window(loader=FakeEngine.loader())
    panel = window.chat
    panel.input.setPlainText("draft")
    assert panel.input.canInsertFromMimeData(_files(path))
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        panel.input.insertFromMimeData(_files(path))
    assert panel.input.toPlainText() == "draft"
    assert [a.name for a in panel.tray.files] == ["main.py"]
    text = QMimeData()
    text.setText("plain words")
    panel.input.insertFromMimeData(text)  # text still pastes as text
    assert "plain words" in panel.input.toPlainText()
    assert chips(panel) == ["main.py, 1 line"]
    (tmp_path / "b.txt").write_text("two\nlines", encoding="utf-8")
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        panel.input.insertFromMimeData(_files(tmp_path / "b.txt"))
    shown = [c for c in panel.tray.findChildren(QWidget, "attachmentChip") if c.isVisibleTo(panel)]
    names = [c.findChild(QWidget, "removeAttachment").accessibleName() for c in shown]
    assert names == ["Remove main.py", "Remove b.txt"]  # what a screen reader says of "×"
    panel.tray.remove(0)
    assert chips(panel) == ["b.txt, 2 lines"]  # at once, not when the event loop comes round
    panel.tray.remove(0)
    assert panel.tray.files == [] and panel.tray.isHidden() and chips(panel) == []


def test_a_file_the_model_cannot_read_is_refused_by_name(qtbot, make_window, tmp_path):
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    (tmp_path / "ok.txt").write_text("fine", encoding="utf-8")
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    _load(qtbot, window)
    panel = window.chat
    refused = _attach(qtbot, panel, tmp_path / "photo.png", tmp_path / "ok.txt")
    assert len(refused) == 1 and refused[0].startswith("photo.png is a PNG image, not text")
    assert panel.status.text().startswith("Not attached: photo.png is a PNG image")
    assert [a.name for a in panel.tray.files] == ["ok.txt"]  # the other file is kept
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        panel.send()  # files alone make a message
    assert window.ctx.chats.current.title == "ok.txt"
    assert loader.made[-1].calls[-1][-1]["content"] == "File: ok.txt\n```\nfine\n```"


def test_an_edited_message_brings_its_files_back(qtbot, make_window, tmp_path):
    (tmp_path / "a.txt").write_text("apple", encoding="utf-8")
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)
    panel = window.chat
    _attach(qtbot, panel, tmp_path / "a.txt")
    panel.input.setPlainText("Which fruit?")
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        panel.send()
    qtbot.mouseClick(panel.message_widgets()[0].edit_button, Qt.MouseButton.LeftButton)
    assert panel.input.toPlainText() == "Which fruit?"
    assert [a.name for a in panel.tray.files] == ["a.txt"]
    assert window.ctx.chats.current.turns == []


def test_a_file_dropped_on_the_chat_is_attached(qtbot, make_window, tmp_path):
    from PySide6.QtCore import QPointF
    from PySide6.QtGui import QDragEnterEvent, QDropEvent

    path = tmp_path / "notes.txt"
    path.write_text("n", encoding="utf-8")
    window = make_window(loader=FakeEngine.loader())
    panel, mime = window.chat, _files(path)
    assert panel.acceptDrops()
    none, left = Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier
    copy = Qt.DropAction.CopyAction
    enter = QDragEnterEvent(panel.rect().center(), copy, mime, none, left)
    panel.dragEnterEvent(enter)
    assert enter.isAccepted()
    text = QMimeData()
    text.setText("words")
    ignored = QDragEnterEvent(panel.rect().center(), copy, text, none, left)
    ignored.ignore()
    panel.dragEnterEvent(ignored)
    assert not ignored.isAccepted()  # only files are taken
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        panel.dropEvent(QDropEvent(QPointF(panel.rect().center()), copy, mime, none, left))
    assert [a.name for a in panel.tray.files] == ["notes.txt"]
    from app.state.chat_history import Turn
    from app.widgets.message import MessageWidget

    message = MessageWidget(Turn("assistant", "hello"))
    qtbot.addWidget(message)
    assert not message.answer_view.acceptDrops()  # a drop on a message reaches the chat


def _small_and_big(folder):
    """A text file of about 50 tokens and one of about 5,000 (more than a 4,096 context)."""
    small, big = folder / "small.txt", folder / "big.txt"
    small.write_text("word " * 40, encoding="utf-8")
    big.write_text("x" * 20_000, encoding="utf-8")
    return small, big


def test_files_are_counted_with_the_models_tokenizer_and_a_large_one_is_flagged(
    qtbot, make_window, tmp_path
):
    from engine.attachments import compose, read_attachment

    small, big = _small_and_big(tmp_path)
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)  # a 4,096-token context; the fake counts a token per 4 characters
    panel = window.chat
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        panel.attach([str(small)])
    want = len(compose("", [read_attachment(small)])) // 4 + 1
    assert chips(panel) == [f"small.txt, 1 line · {want:,} tokens"]
    assert panel.tray.tokens() == want and panel.status.text() == ""
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        panel.attach([str(big)])
    assert panel.tray.tokens() > 4096
    assert "raise the context length (Load tab)" in panel.status.text()
    panel.tray.remove(1)
    assert panel.tray.tokens() == want


def test_files_are_counted_again_on_edit_and_when_a_model_loads(qtbot, make_window, tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("alpha beta " * 30, encoding="utf-8")
    window = make_window(loader=FakeEngine.loader())
    panel = window.chat
    _attach(qtbot, panel, path)  # no model yet: nothing to count with
    assert chips(panel) == ["notes.txt, 1 line"] and panel.tray.tokens() is None
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        _load(qtbot, window)  # the load counts the files waiting
    assert panel.tray.tokens() is not None and "tokens" in chips(panel)[0]
    counted = panel.tray.tokens()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        panel.send()
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        qtbot.mouseClick(panel.message_widgets()[0].edit_button, Qt.MouseButton.LeftButton)
    assert panel.tray.tokens() == counted  # the edited message's files, counted again


def test_files_attached_and_not_sent_stay_with_their_chat(
    qtbot, make_window, settings_store, tmp_path
):
    """Files in the tray, unsent, belong to the chat they were attached in (as the text
    typed there does): another chat shows its own tray, the first has them again, and so
    after a restart; a send takes them."""
    (tmp_path / "notes.md").write_text("buy milk\n", encoding="utf-8")
    window = make_window(loader=FakeEngine.loader())
    panel, chats = window.chat, window.ctx.chats
    first = chats.current.id
    assert _attach(qtbot, panel, tmp_path / "notes.md") == []
    chats.store.create()
    second = chats.store.chats()[0].id
    chats.select(second)
    assert panel.tray.files == [] and chips(panel) == []
    chats.select(first)
    assert [a.name for a in panel.tray.files] == ["notes.md"] and chips(panel)
    window.close()
    again = make_window(loader=FakeEngine.loader(), store=settings_store)
    again.ctx.chats.select(first)
    assert [a.text for a in again.chat.tray.files] == ["buy milk\n"]
    _load(qtbot, again)
    again.chat.input.setPlainText("What first?")
    with qtbot.waitSignal(again.ctx.engine.finished, timeout=3000):
        again.chat.send()
    assert again.ctx.chats.store.get(first).draft_files == []
    assert [a.name for a in again.ctx.chats.current.turns[0].attachments] == ["notes.md"]


def test_a_file_still_being_read_joins_the_chat_it_was_attached_in(
    qtbot, make_window, tmp_path, monkeypatch
):
    import threading

    from app.widgets import attachment_tray

    (tmp_path / "big.md").write_text("a long read\n", encoding="utf-8")
    release = threading.Event()
    read = attachment_tray.read_attachment
    monkeypatch.setattr(attachment_tray, "read_attachment", lambda p: release.wait(5) and read(p))
    window = make_window(loader=FakeEngine.loader())
    panel, chats = window.chat, window.ctx.chats
    first = chats.current.id
    panel.tray.add([str(tmp_path / "big.md")])
    chats.store.create()
    second = chats.store.chats()[0].id
    chats.select(second)  # while the file is read
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        release.set()
    assert panel.tray.files == []  # not in the chat shown now
    assert [a.name for a in chats.store.get(first).draft_files] == ["big.md"]
    chats.select(first)
    assert [a.name for a in panel.tray.files] == ["big.md"]
    # read while its chat is shown again: straight into the tray
    release.clear()
    panel.tray.add([str(tmp_path / "big.md")])
    chats.select(second)
    chats.select(first)
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        release.set()
    assert [a.name for a in panel.tray.files] == ["big.md", "big.md"]
    assert chats.store.get(second).draft_files == []


def test_a_chat_files_pending_files_are_checked_when_read(tmp_path):
    from app.state.chat_store import ChatStore

    folder = tmp_path / "chats"
    folder.mkdir()
    (folder / "aaaaaaaaaaaa.json").write_text(json.dumps({"id": "aaaaaaaaaaaa"}), "utf-8")
    bad = {"id": "bbbbbbbbbbbb", "draft_files": [{"name": "a.md", "text": 3}]}
    (folder / "bbbbbbbbbbbb.json").write_text(json.dumps(bad), "utf-8")
    store = ChatStore(folder)
    assert [c.id for c in store.chats()] == ["aaaaaaaaaaaa"]  # an older file: no pending files
    assert store.get("aaaaaaaaaaaa").draft_files == []
    assert "draft_files[0].text" in store.problems[0]


def test_unsent_files_too_large_for_the_chat_file_stay_in_memory(tmp_path, monkeypatch):
    """A chat file is never written past what a start reads back: unsent files that would
    take it there are kept while the app runs, not written."""
    from app.state import chat_history
    from app.state.chat_store import ChatStore
    from engine.attachments import Attachment

    monkeypatch.setattr(chat_history, "MAX_CHAT_BYTES", 4096)
    store = ChatStore(tmp_path / "chats")
    chat = store.create()
    store.set_draft(chat.id, "small", [Attachment("a.md", "x" * 100)])
    assert "a.md" in store.path(chat.id).read_text("utf-8")
    store.set_draft(chat.id, "big", [Attachment("b.md", "y" * 8000)])
    assert [a.name for a in store.get(chat.id).draft_files] == ["b.md"]  # in memory
    written = json.loads(store.path(chat.id).read_text("utf-8"))
    assert written["draft_files"] == [] and written["draft"] == "big"
    assert ChatStore(tmp_path / "chats").get(chat.id).draft == "big"  # read back at start


def test_many_files_or_long_names_keep_to_the_chats_width(qtbot, make_window, tmp_path):
    """The tray's chips wrap onto lines and scroll past TRAY_PX, and a long name is cut in
    its middle (in the tray and in the message sent): the chat never grows wider than its
    column, nor squeezes the columns beside it, and each message's buttons stay in view."""
    from app.widgets.attachment_tray import MAX_FILES, TRAY_PX

    window = make_window(loader=FakeEngine.loader(script=["Read."]))
    _load(qtbot, window)
    panel = window.chat
    qtbot.wait(50)
    widths, least = window.splitter.sizes(), window.minimumSizeHint().width()
    names = [f"quarterly-report-section-{i:02}-{'x' * 180}.md" for i in range(MAX_FILES)]
    for name in names:
        (tmp_path / name).write_text("totals\n", encoding="utf-8")
    assert _attach(qtbot, panel, *(tmp_path / n for n in names)) == []
    qtbot.wait(50)
    assert window.splitter.sizes() == widths and window.minimumSizeHint().width() == least
    assert panel.tray.height() <= TRAY_PX
    shown = chips(panel)
    assert len(shown) == MAX_FILES and all("…" in text for text in shown)
    panel.input.setPlainText("Sum them up")
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        panel.send()
    qtbot.wait(50)
    assert window.splitter.sizes() == widths and window.minimumSizeHint().width() == least
    view = panel.scroll.viewport()
    for message in panel.message_widgets():
        right = message.copy_button.mapTo(view, message.copy_button.rect().topRight()).x()
        assert right < view.width(), message.property("role")
    label = panel.message_widgets()[0].attachments_label
    assert names[0] in label.toolTip() and names[0] not in label.text()


def test_taking_off_the_file_that_was_too_large_clears_the_warning(qtbot, make_window, tmp_path):
    from PySide6.QtWidgets import QToolButton

    small, big = _small_and_big(tmp_path)
    window = make_window(loader=FakeEngine.loader())
    _load(qtbot, window)  # a 4,096-token context; the fake counts a token per 4 characters
    panel = window.chat
    with qtbot.waitSignal(panel.tray.read_done, timeout=5000):
        panel.attach([str(small), str(big)])
    assert "raise the context length (Load tab)" in panel.status.text()
    drop = [b for b in panel.tray.findChildren(QToolButton, "removeAttachment") if b.isVisible()]
    qtbot.mouseClick(drop[1], Qt.MouseButton.LeftButton)  # the big file's ×
    assert len(chips(panel)) == 1 and chips(panel)[0].startswith("small.txt")
    assert panel.status.text() == ""
