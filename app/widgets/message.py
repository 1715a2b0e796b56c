"""One chat turn: role, Copy (and Edit or Continue) buttons, the files it attached,
collapsed thinking, markdown answer, stats line."""

from __future__ import annotations

import time
import weakref
from datetime import datetime

from PySide6.QtCore import Qt, QTimer, QUrl
from PySide6.QtGui import (
    QColor,
    QCursor,
    QDesktopServices,
    QGuiApplication,
    QPalette,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.chat_controller import format_stats
from app.code_blocks import SCHEME, with_copy_links
from app.dates import message_time
from app.highlight import colour_code
from app.math_spans import with_marks
from app.state.chat_history import Turn
from app.theme import THEME, colour
from app.thinking import split_reply
from app.widgets.attachment_tray import preview
from app.widgets.formulas import draw_formulas
from app.widgets.plain import plain_tip
from engine.attachments import Attachment, compose

MARKDOWN = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value
    | QTextDocument.MarkdownFeature.MarkdownNoHTML.value
)
OPENED_SCHEMES = ("http", "https", "mailto")


class AutoHeightBrowser(QTextBrowser):
    """A read-only markdown view that is exactly as tall as its text (no inner scrollbar).
    With `copy_links`, each code block has a "Copy code" link above it (app/code_blocks.py);
    other links open in the browser."""

    def __init__(self, parent: QWidget | None = None, copy_links: bool = False) -> None:
        super().__init__(parent)
        self.copy_links = copy_links
        self.codes: list[str] = []  # the code blocks' text, for their links
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenLinks(False)  # every link comes to `_clicked`
        self.setAcceptDrops(False)  # a file dropped on a message goes to the chat (attached)
        self.anchorClicked.connect(self._clicked)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._markdown = None

    def set_markdown(self, text: str) -> None:
        if text != self._markdown:
            self._markdown = source = text
            text, found = with_marks(text)  # formulas out of Qt's Markdown reader's way
            if self.copy_links:
                text, self.codes = with_copy_links(text)
            # HTML in a message is shown as the text it is: `std::vector<int>` or `the <div>
            # tag` outside a code block would otherwise vanish as unknown tags (and an
            # <img> could pull in a local file).
            self.document().setMarkdown(text, MARKDOWN)
            _wrap_code_blocks(self.document())
            ink = self.palette().color(QPalette.ColorRole.Text).name()
            draw_formulas(self.document(), source, found, ink)
            self._fit()

    def _clicked(self, url: QUrl) -> None:
        if url.scheme() != SCHEME:
            # Only web and mail links go to the desktop: a model's `file:` link could name
            # a program or a script that the desktop would open.
            if url.scheme().lower() in OPENED_SCHEMES:
                QDesktopServices.openUrl(url)
            else:
                QToolTip.showText(QCursor.pos(), f"Not opened: {url.toString()[:80]}", self)
            return
        n = int(url.path()) if url.path().isdigit() else -1
        if 0 <= n < len(self.codes):
            QGuiApplication.clipboard().setText(self.codes[n])
            QToolTip.showText(QCursor.pos(), "Copied", self)

    def _fit(self, *_args: object) -> None:
        height = int(self.document().size().height()) + 4
        if height != self.height():
            self.setFixedHeight(max(height, 20))

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit()


def _wrap_code_blocks(doc: QTextDocument) -> None:
    """Markdown code blocks come in as non-breakable lines; let them wrap instead of clip,
    and colour them by their language (app/highlight.py)."""
    cursor = QTextCursor(doc)
    cursor.beginEditBlock()  # one layout pass at the end, not one a line (a 500-line reply)
    colour_code(doc, cursor, THEME.dark)  # first: it finds the blocks by their lines' marks
    block = doc.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.nonBreakableLines():
            fmt.setNonBreakableLines(False)
            fmt.setBackground(QColor(colour("#f3f5f8")))
            cursor.setPosition(block.position())
            cursor.setBlockFormat(fmt)
        block = block.next()
    cursor.endEditBlock()


# When each reply still thinking was first shown so (by the turn's id, with a weak reference
# to it, so that a turn gone while thinking leaves nothing to another at its address).
_THINKING_SINCE: dict[int, tuple[weakref.ref, float]] = {}


def _thinking_since(turn: Turn) -> float:
    held = _THINKING_SINCE.get(id(turn))
    if held is None or held[0]() is not turn:
        held = _THINKING_SINCE[id(turn)] = (weakref.ref(turn), time.monotonic())
    return held[1]


def _duration(seconds: float) -> str:
    """3.2 s, 41 s, 2 min 5 s."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


NAME_CHARS = 48  # the most of a file's name a message shows (the tooltip has all of it)


def _short(attachment: Attachment) -> str:
    """'notes.md, 2 lines', a name longer than NAME_CHARS cut in its middle."""
    name, whole = attachment.name, attachment.summary()
    if len(name) <= NAME_CHARS:
        return whole
    return name[: NAME_CHARS - 16] + "…" + name[-15:] + whole[len(name) :]


def fingerprint(turn: Turn) -> tuple:
    """What a message's drawing shows of its turn: a turn whose fingerprint changed is drawn
    again (ChatPanel.rebuild)."""
    names = tuple(a.name for a in turn.attachments)
    replies = (turn.shown, len(turn.others))
    return (
        turn.role,
        turn.content,
        turn.thinking_enabled,
        repr(turn.stats),
        names,
        replies,
        turn.sent,
    )


class MessageWidget(QFrame):
    """Renders a Turn; `update_text` is called as a reply streams in."""

    def __init__(self, turn: Turn, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.turn = turn
        self.fingerprint = fingerprint(turn)
        self.setObjectName(f"message-{turn.role}")
        self.setProperty("role", turn.role)
        self._thinking_enabled = turn.thinking_enabled
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 10, 14, 10)
        layout.setSpacing(4)
        who = {"user": "You", "assistant": "Snug", "error": "Engine error"}.get(
            turn.role, turn.role
        )
        self.role_label = QLabel(who)
        self.role_label.setObjectName("roleLabel")
        self.copy_button = QToolButton()
        self.copy_button.setObjectName("copyMessage")
        self.copy_button.setText("Copy")
        self.copy_button.setToolTip("Copy the message as Markdown (without its thinking)")
        self.copy_button.clicked.connect(self.copy)
        self.branch_button = QToolButton()
        self.branch_button.setObjectName("branchMessage")
        self.branch_button.setText("Branch")
        self.branch_button.setToolTip("A new chat with this conversation up to here")
        self.edit_button = QToolButton()  # shown on the user's messages (ChatPanel)
        self.edit_button.setObjectName("editMessage")
        self.edit_button.setText("Edit")
        self.edit_button.hide()
        self.continue_button = QToolButton()  # shown on a cut last reply (ChatPanel)
        self.continue_button.setObjectName("continueReply")
        self.continue_button.setText("Continue")
        self.continue_button.setToolTip("Go on with this reply where it stopped")
        self.continue_button.hide()
        # The replies Regenerate kept, one at a time: shown on the chat's last (ChatPanel).
        self.prev_reply, self.next_reply = QToolButton(), QToolButton()
        for button, text, tip in (
            (self.prev_reply, "‹", "The reply before this one"),
            (self.next_reply, "›", "The reply after this one"),
        ):
            button.setObjectName("replyNav")
            button.setText(text)
            button.setToolTip(tip)
            button.setAccessibleName(tip)
            button.hide()
        self.reply_count = QLabel(f"{turn.shown + 1} / {len(turn.others) + 1}")
        self.reply_count.setObjectName("replyCount")
        self.reply_count.setToolTip("Regenerate keeps each reply: ‹ and › go through them")
        self.reply_count.hide()
        self.sent_label = QLabel()
        self.sent_label.setObjectName("sentLabel")
        if turn.sent is not None:
            short, full = message_time(turn.sent, datetime.now())
            self.sent_label.setText(short)
            verb = {"user": "Sent", "assistant": "Replied"}.get(turn.role, "At")
            self.sent_label.setToolTip(f"{verb} {full}")
        else:  # a chat file from before the time was kept
            self.sent_label.hide()
        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.role_label)
        top.addWidget(self.sent_label)
        top.addStretch(1)
        top.addWidget(self.prev_reply)
        top.addWidget(self.reply_count)
        top.addWidget(self.next_reply)
        top.addWidget(self.edit_button)
        top.addWidget(self.continue_button)
        top.addWidget(self.branch_button)
        top.addWidget(self.copy_button)
        layout.addLayout(top)
        files = turn.attachments
        self.attachments_label = QLabel("Attached: " + " · ".join(_short(a) for a in files))
        self.attachments_label.setObjectName("attachmentsLabel")
        self.attachments_label.setWordWrap(True)
        self.attachments_label.setTextFormat(Qt.TextFormat.PlainText)
        # A long name that cannot wrap would widen the message past the chat's view.
        self.attachments_label.setMinimumWidth(1)
        self.attachments_label.setToolTip(
            plain_tip("\n\n".join(f"{a.summary()}\n{preview(a, 6)}" for a in files))
        )
        self.attachments_label.setVisible(bool(files))
        layout.addWidget(self.attachments_label)

        self.think_toggle = QToolButton()
        self.think_toggle.setObjectName("thinkToggle")
        self.think_toggle.setCheckable(True)
        self.think_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.think_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.think_toggle.toggled.connect(self._toggle_thinking)
        self.thinking_view = AutoHeightBrowser()
        self.thinking_view.setObjectName("thinkingView")
        self.thinking_view.hide()
        layout.addWidget(self.think_toggle)
        layout.addWidget(self.thinking_view)
        self.think_toggle.hide()

        self.answer_view = AutoHeightBrowser(copy_links=True)
        self.answer_view.setObjectName("answerView")
        layout.addWidget(self.answer_view)
        self.stats_label = QLabel()
        self.stats_label.setObjectName("statsLabel")
        self.stats_label.hide()
        layout.addWidget(self.stats_label)
        self._role = turn.role
        self.update_text(turn.content, done=bool(turn.stats) or turn.role != "assistant")
        self.set_stats(turn.stats)

    def update_text(self, text: str, done: bool = False) -> None:
        if self._role != "assistant":
            self._source = compose(text, self.turn.attachments)  # Copy: what the model read
            self.answer_view.set_markdown(text)
            self.answer_view.setVisible(bool(text))  # a message of files alone
            return
        split = split_reply(text, self._thinking_enabled)
        self._source = split.answer
        if split.thinking or not split.thinking_done:
            self.think_toggle.show()
            words = len(split.thinking.split())
            plural = "word" if words == 1 else "words"
            took = self.turn.stats.get("thinking_s") if split.thinking_done else None
            if not split.thinking_done and not done and split.thinking:
                # The seconds so far, from its first thought shown (redrawn as tokens come;
                # kept by the turn, so a chat shown again goes on counting).
                so_far = time.monotonic() - _thinking_since(self.turn)
                label = f"Thinking… {so_far:.0f} s" if so_far >= 1 else "Thinking…"
            elif not split.thinking_done and not done:
                label = "Thinking…"
            elif not split.thinking_done:  # it ended in its thinking: stopped, or cut
                label = f"Thinking cut short ({words} {plural})"
            elif isinstance(took, int | float):
                label = f"Thought for {_duration(took)} ({words} {plural})"
            else:
                label = f"Thought ({words} {plural})"
            if split.thinking_done or done:
                _THINKING_SINCE.pop(id(self.turn), None)
            self.think_toggle.setText(label)
            self.thinking_view.set_markdown(split.thinking)
        self.answer_view.set_markdown(split.answer if split.answer or done else "…")

    def set_stats(self, stats: dict) -> None:
        line = format_stats(stats) if stats else ""
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))

    def show_replies(self, on: bool) -> None:
        """‹ n / m › where the turn has other replies and `on` (the chat's last, not busy)."""
        turn, on = self.turn, on and bool(self.turn.others)
        for widget in (self.prev_reply, self.reply_count, self.next_reply):
            widget.setVisible(on)
        self.prev_reply.setEnabled(turn.shown > 0)
        self.next_reply.setEnabled(turn.shown < len(turn.others))

    def focus_order(self) -> list[QWidget]:
        """What Tab stops at in the message, as it is laid out (hidden ones are passed)."""
        return [
            self.prev_reply,
            self.next_reply,
            self.edit_button,
            self.continue_button,
            self.branch_button,
            self.copy_button,
            self.think_toggle,
            self.thinking_view,
            self.answer_view,
        ]

    def answer_text(self) -> str:
        return self.answer_view.toPlainText()

    def copy(self) -> None:
        """The message's Markdown (a reply's answer, not its thinking) to the clipboard."""
        QGuiApplication.clipboard().setText(self._source)
        self.copy_button.setText("Copied")
        QTimer.singleShot(1500, self.copy_button, lambda: self.copy_button.setText("Copy"))

    def _toggle_thinking(self, shown: bool) -> None:
        self.think_toggle.setArrowType(Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow)
        self.thinking_view.setVisible(shown)
