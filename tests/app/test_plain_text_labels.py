"""Text the user typed or a file holds is shown as the characters it is, never read as HTML:
Qt takes a label's or a tooltip's text for rich text where it looks like a tag (`<div>`,
`a < b and c > d`), and would drop the tags, break the line, or draw an attached HTML file."""

from __future__ import annotations

from fake_engine import FakeEngine
from helpers import answer_next_dialog
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import Qt as GuiQt
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QApplication, QLabel, QMessageBox

from app.engine_bridge import LoadRequest
from app.widgets.message import MessageWidget
from engine.attachments import Attachment

TITLE = "Is a < b and c > d? How do I use <div> in React?"
PAGE = "<h1>Launch</h1>\n<p>Ship <b>it</b></p>\n"


def _drawn_whole(label: QLabel, text: str) -> bool:
    """Whether the label draws `text` on one line at its full width, as plain text."""
    hint = label.sizeHint()
    metrics = label.fontMetrics()
    return hint.width() >= metrics.horizontalAdvance(text) and hint.height() < 2 * metrics.height()


def _plain(label: QLabel) -> bool:
    """Whether a label (one that wraps its lines) shows its text as plain text."""
    return label.textFormat() == Qt.TextFormat.PlainText or not GuiQt.mightBeRichText(label.text())


def _tip_reads(tip: str) -> str:
    """What a tooltip shows, read as Qt reads it (rich text where it looks like HTML)."""
    doc = QTextDocument()
    if GuiQt.mightBeRichText(tip):
        doc.setHtml(tip)
    else:
        doc.setPlainText(tip)
    return doc.toPlainText()


def test_a_title_with_tags_is_shown_as_typed(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(delay=0.02, script=["word "] * 200))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.close_welcome()
    chats, sidebar, panel = window.ctx.chats, window.sidebar, window.chat
    assert chats.send(TITLE)
    asked = chats.current.id
    assert chats.current.title.startswith("Is a < b and c > d?")
    title = chats.current.title
    assert panel.title.text() == title
    assert _drawn_whole(panel.title, title)  # not "Is a d?" over two lines
    item = sidebar.list.currentItem()
    assert _tip_reads(item.toolTip()) == title
    # The status line, while the reply streams into that chat and another is shown.
    chats.new_chat()
    assert "Answering" in panel.status.text() and title in panel.status.text()
    assert _plain(panel.status)
    chats.stop()
    qtbot.waitUntil(lambda: not chats.busy, timeout=5000)
    # Deleting it asks by its title, as typed.
    seen: list[str] = []
    labels: list[bool] = []

    def check_box() -> None:
        box = QApplication.activeModalWidget()
        if isinstance(box, QMessageBox):
            label = box.findChild(QLabel, "qt_msgbox_label")
            labels.append(_plain(label))

    QTimer.singleShot(10, check_box)
    answer_next_dialog("Cancel", seen)
    sidebar.delete(asked)
    assert f"Delete the chat “{title}”?" in seen
    assert labels == [True]


def test_an_attached_html_file_is_shown_as_its_text(qtbot):
    turn_files = [Attachment("<b>notes</b>.html", PAGE)]
    from app.state.chat_history import Turn

    widget = MessageWidget(Turn("user", "What is left?", attachments=turn_files))
    qtbot.addWidget(widget)
    label = widget.attachments_label
    assert _plain(label)
    assert "<b>notes</b>.html" in label.text()
    assert PAGE.strip() in _tip_reads(label.toolTip())
    assert "<b>notes</b>.html" in _tip_reads(label.toolTip())


def test_a_file_in_the_tray_is_shown_as_its_text(qtbot, tmp_path):
    from app.widgets.attachment_tray import AttachmentTray

    tray = AttachmentTray()
    qtbot.addWidget(tray)
    tray.put([Attachment("page.html", PAGE)])
    chips = [w for w in tray.findChildren(QLabel) if w.isVisibleTo(tray)]
    assert chips
    assert PAGE.strip() in _tip_reads(chips[0].toolTip())
