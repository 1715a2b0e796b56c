"""The chat area: the messages of the chat on show, the composer, Stop and Regenerate; it
takes a ChatController and follows its signals."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QMimeData, QPoint, QStandardPaths, Qt, QTimer, Signal
from PySide6.QtGui import (
    QDragEnterEvent,
    QDropEvent,
    QKeyEvent,
    QKeySequence,
    QShortcut,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat_controller import ChatController
from app.theme import THEME
from app.widgets.attachment_tray import AttachmentTray, local_files
from app.widgets.elided_label import ElidedLabel
from app.widgets.message import MessageWidget, fingerprint
from app.widgets.plain import plain_tip
from app.widgets.system_prompt import SystemPromptDialog

DOCUMENTS = QStandardPaths.StandardLocation.DocumentsLocation
GROW_MS = 50  # the least time between two redraws of a streamed reply
PAGE = 20  # messages drawn when a chat is shown, and added by "Show earlier messages"
FOUND_MS = 2500  # how long a message found by the chat search stays marked
EDIT_LAST = "Change this message and send it again"
EDIT_EARLIER = "Change this message in a new chat (this one stays as it is)"


class Composer(QPlainTextEdit):
    """Message box: Enter sends, Shift+Enter adds a line, Ctrl+Enter regenerates. Files
    dropped or pasted on it are attached (`files_given`), not typed in as their paths."""

    submit = Signal()
    regenerate = Signal()
    files_given = Signal(list)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 (Qt override)
        return bool(local_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 (Qt override)
        files = local_files(source)
        if files:
            self.files_given.emit(files)
        else:
            super().insertFromMimeData(source)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt override)
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            mods = event.modifiers()
            if mods & Qt.KeyboardModifier.ControlModifier:
                self.regenerate.emit()
                return
            if not mods & Qt.KeyboardModifier.ShiftModifier:
                self.submit.emit()
                return
        super().keyPressEvent(event)


class ChatPanel(QWidget):
    """Messages of the current chat, the composer, Stop / Regenerate, and a stats line."""

    def __init__(self, chats: ChatController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("chatPanel")
        self.chats = chats
        self._messages: list[MessageWidget] = []
        self._drawn: str | None = None  # the chat whose messages are drawn
        self._first = 0  # the index in its turns of the first message drawn
        self._pending: str | None = None  # a streamed reply's text not drawn yet
        self._grow_timer = QTimer(self)  # draws it: at most one redraw per interval
        self._grow_timer.setSingleShot(True)
        self._grow_timer.timeout.connect(self._draw_reply)
        self.redraws = 0  # how many times a streamed reply was drawn
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(0)

        header = QWidget()
        header.setObjectName("chatHeader")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(24, 8, 16, 8)
        self.title = ElidedLabel()  # a long title ends in "…": the columns keep their widths
        self.title.setObjectName("chatTitle")
        hl.addWidget(self.title, 1)
        self.system_button = QToolButton()
        self.system_button.setObjectName("chatSystem")
        self.system_button.setText("System prompt")
        self.system_button.clicked.connect(self.edit_system_prompt)
        hl.addWidget(self.system_button)
        outer.addWidget(header)

        self.scroll = QScrollArea()
        self.scroll.setObjectName("chatScroll")
        self.scroll.setWidgetResizable(True)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        body = QWidget()
        body.setObjectName("chatBody")
        self.body_layout = QVBoxLayout(body)
        self.body_layout.setContentsMargins(24, 16, 24, 16)
        self.body_layout.setSpacing(12)
        self.earlier_button = QPushButton()
        self.earlier_button.setObjectName("earlierMessages")
        self.earlier_button.clicked.connect(self.show_earlier)
        self.body_layout.addWidget(self.earlier_button, 0, Qt.AlignmentFlag.AlignHCenter)
        self.empty_hint = QLabel()
        self.empty_hint.setObjectName("emptyHint")
        self.empty_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_hint.setWordWrap(True)
        self.body_layout.addWidget(self.empty_hint)
        self.body_layout.addStretch(1)
        self.scroll.setWidget(body)
        self._found: QWidget | None = None  # a message the search found, held in view a moment
        self.scroll.verticalScrollBar().rangeChanged.connect(self._keep_found)
        outer.addWidget(self.scroll, 1)

        bottom = QWidget()
        bottom.setObjectName("composerBar")
        bl = QVBoxLayout(bottom)
        bl.setContentsMargins(24, 8, 24, 12)
        bl.setSpacing(6)
        status_row = QHBoxLayout()
        self.status = QLabel()
        self.status.setObjectName("chatStatus")
        # Wrapped: a long line (a refused file, the stats) takes a second line, never the
        # width of the window (it would clip, and push the sidebar aside).
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # titles, file names, as written
        status_row.addWidget(self.status, 1)
        self.thinking = QCheckBox("Thinking")
        self.thinking.setToolTip("Let the model reason before it answers (shown collapsed)")
        self.thinking.setChecked(chats.settings.thinking)
        self.thinking.toggled.connect(lambda on: chats.settings.set("chat/thinking", on))
        chats.settings.changed.connect(self._setting_changed)
        self.attach_button = QPushButton("Attach…")
        self.attach_button.setObjectName("attachFiles")
        self.attach_button.setToolTip(
            "Attach text files, PDFs or Word documents: the model reads them with your message "
            "(or drop files on the chat)"
        )
        self.attach_button.clicked.connect(self.choose_files)
        status_row.addWidget(self.attach_button)
        status_row.addWidget(self.thinking)
        bl.addLayout(status_row)
        self.tray = AttachmentTray()
        self.tray.read_done.connect(self._files_read)
        self.tray.read_for_before.connect(self._files_read_for_before)
        self._read_for: dict[int, str] = {}  # a tray's generation: the chat it was filled in
        bl.addWidget(self.tray)
        row = QHBoxLayout()
        row.setSpacing(8)
        self.input = Composer()
        self.input.setObjectName("composer")
        self.input.setPlaceholderText("Message Snug…  (Enter to send, Shift+Enter for a new line)")
        self.input.setFixedHeight(72)
        self.input.setTabChangesFocus(True)  # Tab goes on to Send, as in any form
        self.input.submit.connect(self.send)
        self.input.regenerate.connect(chats.regenerate)
        self.input.files_given.connect(self.attach)
        row.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        buttons.setSpacing(6)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("primary")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop generating (Esc)")
        self.stop_button.clicked.connect(chats.stop)
        self.regen_button = QPushButton("Regenerate")
        self.regen_button.setToolTip("Answer the last message again (Ctrl+Enter)")
        self.regen_button.clicked.connect(chats.regenerate)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.regen_button)
        row.addLayout(buttons)
        bl.addLayout(row)
        outer.addWidget(bottom)

        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=chats.stop)
        chats.current_changed.connect(lambda _id: self.rebuild())
        chats.current_changed.connect(lambda _id: self._busy(chats.busy))
        chats.turns_changed.connect(self._turns_changed)
        chats.reply_grew.connect(self._reply_grew)
        chats.busy_changed.connect(self._busy)
        chats.notice.connect(self.status.setText)
        chats.store.chat_updated.connect(self._title_changed)
        chats.engine.state_changed.connect(lambda _s: self._busy(chats.busy))
        THEME.changed.connect(self._theme_changed)
        self._text_size(chats.settings.get("app/chat_text_size"))
        chats.engine.loaded.connect(lambda _info: self.tray.recount(self._count()))
        self.setAcceptDrops(True)
        self.rebuild()
        self._busy(False)

    # -- actions
    def send(self) -> None:
        if self.tray.reading:
            self.status.setText("Still reading the attached files…")
            return
        if self.chats.send(self.input.toPlainText(), self.tray.files):
            self.input.clear()
            self.tray.clear()
            self.chats.store.set_draft(self.chats.current.id, "", [])

    def keep_draft(self) -> None:
        """What the message box holds, and the files attached to it, kept with the chat it
        was typed in (when another chat is shown, and when the window closes), so they are
        there again."""
        if self._drawn is not None:
            self.chats.store.set_draft(self._drawn, self.input.toPlainText(), self.tray.files)

    def _files_read_for_before(self, generation: int, files: list) -> None:
        """Files still being read when another chat was shown: they join the chat they
        were attached in."""
        chat_id = self._read_for.pop(generation, None)
        if chat_id is not None and chat_id == self._drawn:  # shown again meanwhile
            self.tray.put(files)
            self.tray.recount(self._count())
            return
        chat = self.chats.store.get(chat_id) if chat_id is not None else None
        if chat is not None:
            self.chats.store.set_draft(chat.id, chat.draft, chat.draft_files + files)

    def choose_files(self) -> None:
        start = QStandardPaths.writableLocation(DOCUMENTS) or str(Path.home())
        paths, _ = QFileDialog.getOpenFileNames(
            self,
            "Attach files",
            start,
            "Text, PDF and Word (*.txt *.md *.py *.json *.csv *.log *.pdf *.docx);;All files (*)",
        )
        self.attach(paths)

    def attach(self, paths: list[str]) -> None:
        """Read `paths` into the tray, each counted with the loaded model's tokenizer."""
        self.tray.add(paths, self._count())

    def _count(self) -> Callable[[str], int] | None:
        """The loaded model's token count of a text (None: no model here to count with)."""
        tokenizer = self.chats.engine.info.get("tokenizer")
        return (lambda text: len(tokenizer.encode(text))) if tokenizer is not None else None

    def _files_read(self, refused: list) -> None:
        context = self.chats.engine.info.get("context")
        tokens = self.tray.tokens()
        if refused:
            self.status.setText("Not attached: " + "; ".join(refused))
        elif tokens is not None and isinstance(context, int) and tokens > context // 2:
            self.status.setText(
                f"The attached files take {tokens:,} tokens of the {context:,} the model was "
                "loaded with: raise the context length (Load tab) and load again, or attach "
                "a part"
                if tokens >= context
                else f"The attached files take {tokens:,} of the {context:,} tokens of context"
            )
        elif self.status.text().startswith(("Not attached", "Still reading", "The attached")):
            self.status.setText("")  # what the line said of earlier files is over

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt override)
        if local_files(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 (Qt override)
        files = local_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.attach(files)

    def edit_last(self) -> None:
        """The last message back in the composer, out of the chat (a draft already there
        stays, after it)."""
        turn = self.chats.edit_last()
        if turn is None:
            return
        draft = self.input.toPlainText().strip()
        self.input.setPlainText(turn.content + (f"\n\n{draft}" if draft else ""))
        self.tray.put(turn.attachments)
        self.tray.recount(self._count())
        self.input.setFocus()
        self.input.moveCursor(QTextCursor.MoveOperation.End)

    def edit_system_prompt(self) -> None:
        """This chat's own system prompt, or the settings' again (a dialog)."""
        chat = self.chats.current
        dialog = SystemPromptDialog(chat.system_prompt, self.chats.settings.system_prompt, self)
        if dialog.exec() == SystemPromptDialog.DialogCode.Accepted:
            self.chats.store.set_system_prompt(chat.id, dialog.prompt())
            self._show_system_prompt()

    def _show_system_prompt(self) -> None:
        own = self.chats.current.system_prompt
        text = own if own is not None else self.chats.settings.system_prompt
        self.system_button.setText(
            "System prompt (this chat)" if own is not None else "System prompt"
        )
        self.system_button.setToolTip(
            plain_tip(
                ("This chat's own: " if own is not None else "The default (Settings > Chat): ")
                + (text.strip() or "none")
            )
        )

    def _text_size(self, points: object) -> None:
        """The messages' and the message box's text at `points` (Settings > App); the rest
        of the window keeps the theme's sizes."""
        rule = f"#answerView, #thinkingView, #composer {{ font-size: {int(points)}pt; }}"
        self.setStyleSheet(rule)

    def _setting_changed(self, key: str, value: object) -> None:
        if key == "app/chat_text_size":
            self._text_size(value)
        if key == "chat/thinking" and self.thinking.isChecked() != bool(value):
            self.thinking.setChecked(bool(value))
        if key == "chat/system_prompt":
            self._show_system_prompt()  # the default the button speaks of

    # -- view
    def rebuild(self, whole: bool = False) -> None:
        """Draw the current chat: its last PAGE messages (Show earlier messages adds more).
        The messages already drawn for it, unchanged, stay; those after the first that
        changed are drawn again: a send or a reply's end redraws the chat's tail, not its
        hundreds of messages. `whole`: every message drawn again (another theme)."""
        chat = self.chats.current
        self._grow_timer.stop()
        self._pending = None
        self._found = None  # a message found by the search is not held in view any more
        other = chat.id != self._drawn
        if other:  # another chat: the message box holds its own draft, and its files
            self.keep_draft()
            if self.tray.reading and self._drawn is not None:
                self._read_for[self.tray.generation] = self._drawn
            self.tray.take()
            self.tray.put(chat.draft_files)
            self.tray.recount(self._count())
            self.input.setPlainText(chat.draft)
            self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.title.setText(chat.title)
        self._show_system_prompt()
        if other or self._first >= len(chat.turns):
            self._first, whole = max(0, len(chat.turns) - PAGE), True
        keep = 0
        if not whole:
            for widget, turn in zip(self._messages, chat.turns[self._first :], strict=False):
                if widget.turn is not turn or widget.fingerprint != fingerprint(turn):
                    break
                keep += 1
        # A reply whose thinking was opened stays open when it is drawn again (its end, a
        # theme change).
        opened = [w.turn for w in self._messages[keep:] if w.think_toggle.isChecked()]
        for widget in self._messages[keep:]:
            self.body_layout.removeWidget(widget)
            widget.hide()
            widget.deleteLater()
        self._messages = self._messages[:keep]
        for turn in chat.turns[self._first + keep :]:
            widget = MessageWidget(turn)
            if any(turn is t for t in opened) and not widget.think_toggle.isHidden():
                widget.think_toggle.setChecked(True)
            self._add(widget)
        self._drawn = chat.id
        self._show_earlier_button()
        self._update_hint()
        self._scroll_to_end()

    def show_earlier(self) -> None:
        """Draw the PAGE messages before the first one drawn, above it; the messages on
        screen stay where they are."""
        chat = self.chats.current
        start = max(0, self._first - PAGE)
        if chat.id != self._drawn or start == self._first:
            return
        bar = self.scroll.verticalScrollBar()
        from_end = bar.maximum() - bar.value()
        widgets = [MessageWidget(turn) for turn in chat.turns[start : self._first]]
        at = self.body_layout.count() - 1  # before the stretch, where no message is drawn
        if self._messages:
            at = self.body_layout.indexOf(self._messages[0])
        for i, widget in enumerate(widgets):
            self._connect(widget)
            self.body_layout.insertWidget(at + i, widget)
        self._messages[:0] = widgets
        self._first = start
        _tab_after(self.scroll, self._messages)  # Tab goes through them in their order
        self._show_earlier_button()
        self._busy(self.chats.busy)
        QTimer.singleShot(0, self, lambda: bar.setValue(bar.maximum() - from_end))

    def show_found(self, query: str) -> None:
        """Bring the chat's last message that holds `query` (casefolded; its text or an
        attached file's name) into view, drawing the earlier messages down to it, and mark
        it for FOUND_MS (a reply found by its thinking alone with its thinking shown);
        nothing where only the chat's title holds it."""
        turns = self.chats.current.turns
        found = next((i for i in range(len(turns) - 1, -1, -1) if turns[i].holds(query)), None)
        if found is None:
            return
        while found < self._first:
            self.show_earlier()
        widget = self._messages[found - self._first]
        parts = [part.casefold() for part in turns[found].shown_text()]
        if len(parts) == 2 and query in parts[0] and query not in parts[1]:
            widget.think_toggle.setChecked(True)  # a reply found by its thinking: shown
        _mark(widget, True)
        # In the middle of the view, after the scroll to the end that a chat shown asks for,
        # and again as the messages drawn take their heights (the range grows), while marked.
        self._found = widget
        QTimer.singleShot(0, self, lambda: self._centre(widget))
        QTimer.singleShot(FOUND_MS, widget, lambda: self._unmark(widget))

    def _centre(self, widget: QWidget) -> None:
        top = widget.mapTo(self.scroll.widget(), QPoint(0, 0)).y()
        room = self.scroll.viewport().height() - widget.height()
        self.scroll.verticalScrollBar().setValue(max(0, top - max(0, room) // 2))

    def _keep_found(self, *_range: int) -> None:
        if self._found is not None:
            self._centre(self._found)

    def _unmark(self, widget: QWidget) -> None:
        if self._found is widget:
            self._found = None
        _mark(widget, False)

    def _show_earlier_button(self) -> None:
        shown = min(self._first, PAGE)
        self.earlier_button.setText(
            f"Show {shown} earlier messages ({self._first:,} not shown)"
            if shown > 1
            else "Show the earlier message"
        )
        self.earlier_button.setVisible(self._first > 0)

    def _connect(self, widget: MessageWidget) -> None:
        # Edit finds its message's place when clicked, and Continue acts on the chat's last
        # reply (`_busy` shows it there only), so every message's buttons can be connected
        # once, as it is drawn.
        widget.edit_button.clicked.connect(lambda: self._edit(widget))
        widget.continue_button.clicked.connect(self.chats.continue_reply)
        widget.prev_reply.clicked.connect(lambda: self.chats.show_reply(widget.turn.shown - 1))
        widget.next_reply.clicked.connect(lambda: self.chats.show_reply(widget.turn.shown + 1))
        widget.branch_button.clicked.connect(lambda: self._branch(widget))

    def _branch(self, widget: MessageWidget) -> None:
        index = self._index(widget)
        if index is not None and self.chats.branch(index):
            self.input.setFocus()  # the branch's next message is typed there

    def _edit(self, widget: MessageWidget) -> None:
        """Edit: the last message back in the composer; an earlier one in a branch."""
        users = [m for m in self._messages if m.property("role") == "user"]
        index = self._index(widget)
        if users and widget is users[-1]:
            self.edit_last()
        elif index is not None and self.chats.edit_earlier(index):
            self.input.setFocus()

    def _index(self, widget: MessageWidget) -> int | None:
        """The message's place in the chat on show."""
        turns = self.chats.current.turns
        return next((i for i, t in enumerate(turns) if t is widget.turn), None)

    def _add(self, widget: MessageWidget) -> None:
        self._connect(widget)
        self.body_layout.insertWidget(self.body_layout.count() - 1, widget)
        # Tab reaches the message where it is on screen: after the one above it (or the
        # chat's top), before the message box, not after the right column's widgets.
        _tab_after(
            self._messages[-1].focus_order()[-1] if self._messages else self.scroll, [widget]
        )
        self._messages.append(widget)

    def _update_hint(self) -> None:
        if self._messages:
            self.empty_hint.hide()
            return
        loaded = self.chats.engine.state in ("ready", "generating")
        self.empty_hint.setText(
            "Ask anything. Replies stream in as they are generated."
            if loaded
            else "No model loaded yet.\nPick one under Models, check that it fits, then Load."
        )
        self.empty_hint.show()

    def _theme_changed(self, _dark: bool) -> None:
        self.rebuild(whole=True)  # code blocks are shaded as they are laid out
        self._busy(self.chats.busy)  # and the buttons shown again as they were

    def _title_changed(self, chat_id: str) -> None:
        if chat_id == self.chats.current.id:
            self.title.setText(self.chats.current.title)

    def _turns_changed(self, chat_id: str) -> None:
        if chat_id == self.chats.current.id:
            self.rebuild()
            self._busy(self.chats.busy)

    def _reply_grew(self, chat_id: str, text: str) -> None:
        """The reply's text so far, drawn at most once per interval: a redraw lays out the
        whole reply again, so the interval grows with what the last one took (a long
        reply's redraws would otherwise take the GUI thread's every moment)."""
        if chat_id != self.chats.current.id or not self._messages:
            return
        self._pending = text
        if not self._grow_timer.isActive():  # none drawn lately: this one now
            self._draw_reply()

    def _draw_reply(self) -> None:
        """The pending text drawn, and the next redraw held back for the interval."""
        text, self._pending = self._pending, None
        if text is None or not self._messages:
            return
        bar = self.scroll.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 40
        start = time.perf_counter()
        self._messages[-1].update_text(text)
        self.redraws += 1
        took_ms = (time.perf_counter() - start) * 1000
        self._grow_timer.start(int(min(max(GROW_MS, 3 * took_ms), 1000)))
        if at_end:
            self._scroll_to_end()

    def _scroll_to_end(self) -> None:
        bar = self.scroll.verticalScrollBar()
        QTimer.singleShot(0, lambda: bar.setValue(bar.maximum()))

    def _busy(self, busy: bool) -> None:
        loaded = self.chats.can_send()
        self.stop_button.setEnabled(busy)
        self.send_button.setEnabled(loaded and not busy)
        self.regen_button.setEnabled(self.chats.can_regenerate())
        users = [m for m in self._messages if m.property("role") == "user"]
        for m in users:
            m.edit_button.setVisible(not busy)
            m.edit_button.setToolTip(EDIT_LAST if m is users[-1] else EDIT_EARLIER)
        can_continue = self.chats.can_continue()
        for m in self._messages:
            m.continue_button.setVisible(can_continue and m is self._messages[-1])
            m.show_replies(m is self._messages[-1] and not busy)
            m.branch_button.setEnabled(not busy)
        self._update_hint()

    def message_widgets(self) -> list[MessageWidget]:
        return list(self._messages)


def _tab_after(before: QWidget, messages: list[MessageWidget]) -> None:
    """Tab goes from `before` through the messages' stops, in their order."""
    for widget in messages:
        for item in widget.focus_order():
            QWidget.setTabOrder(before, item)
            before = item


def _mark(widget: QWidget, found: bool) -> None:
    """A message marked (or not) as the one the chat search found (style.qss draws it)."""
    widget.setProperty("found", found)
    widget.style().unpolish(widget)  # the style sheet read again for the new property
    widget.style().polish(widget)
