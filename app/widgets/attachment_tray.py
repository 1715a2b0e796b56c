"""The files waiting to go with the next message: read on a thread, shown as chips above the
composer, each with a button that takes it off."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.widgets.flow_layout import FlowLayout
from app.widgets.plain import plain_tip
from engine.attachments import Attachment, AttachmentRefused, compose, read_attachment

MAX_FILES = 20  # a message's files at most: past that, a folder's worth went in by mistake
CHIP_PX = 320  # the most a chip's text takes: a longer file name is cut in its middle
TRAY_PX = 96  # the most height the chips take (about three lines), scrolled past that


def local_files(mime: QMimeData) -> list[str]:
    """The local files a drop or a paste carries (none for text or remote links)."""
    if not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile() and u.toLocalFile()]


class AttachmentTray(QWidget):
    """The pending files. `add(paths)` reads them on a thread (a PDF can take seconds);
    `read_done` reports what it refused, one line a file (and comes, with none, once the
    files are counted again or one is taken off); `take()` hands the files to a
    message and empties the tray. With a `count` (the loaded model's tokenizer), each file
    is counted as the model will read it, on the same thread, and its chip says so."""

    read_done = Signal(list)  # the refusals' messages (empty: every file was taken)
    # Files read for the tray as it was before a `take()` (its generation, the files): the
    # chat that was shown when they were added keeps them (ChatPanel).
    read_for_before = Signal(int, list)
    _files_read = Signal(int, list, list)  # generation, (attachment, tokens) pairs, refusals
    _recounted = Signal(int, list)  # generation, (attachment, tokens) pairs

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentTray")
        self._files: list[Attachment] = []
        self._tokens: list[int | None] = []  # each file's tokens, where they were counted
        self._reading = 0  # readers not yet back
        self._generation = 0  # bumped by take() and clear(): files read for a sent message drop
        # The chips wrap onto more lines, however many (the tray never widens the chat),
        # and scroll past TRAY_PX (nor does it take the messages' room).
        self._scroll = QScrollArea()
        self._scroll.setObjectName("trayScroll")
        self._scroll.setWidgetResizable(True)
        self._scroll.setFrameShape(QFrame.Shape.NoFrame)
        self._scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        body = QWidget()
        body.setObjectName("trayBody")
        self._layout = FlowLayout(body)
        self._scroll.setWidget(body)
        self.setStyleSheet("#trayScroll, #trayBody { background: transparent; border: none; }")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self._scroll)
        self._files_read.connect(self._arrived)
        self._recounted.connect(self._counts_arrived)
        self.hide()

    @property
    def files(self) -> list[Attachment]:
        return list(self._files)

    @property
    def reading(self) -> bool:
        return self._reading > 0

    @property
    def generation(self) -> int:
        """Which filling of the tray this is: each `take()` starts a new one."""
        return self._generation

    def tokens(self) -> int | None:
        """What the files take of the context (None where any is uncounted)."""
        if not self._files or None in self._tokens:
            return None
        return sum(t for t in self._tokens if t is not None)

    def add(self, paths: Sequence[str], count: Callable[[str], int] | None = None) -> None:
        """Read `paths` on a thread and add the files that check out (in order)."""
        paths = [p for p in paths if p]
        if not paths:
            return
        self._reading += 1
        generation, room = self._generation, MAX_FILES - len(self._files)

        def read() -> None:
            got, refused = [], []
            for path in paths:
                if len(got) >= room:
                    refused.append(f"{Path(path).name}: a message takes {MAX_FILES} files at most")
                    continue
                try:
                    attachment = read_attachment(path)
                except AttachmentRefused as exc:
                    refused.append(str(exc))
                    continue
                got.append((attachment, _counted(count, attachment)))
            try:
                self._files_read.emit(generation, got, refused)
            except RuntimeError:  # the window closed while the files were read
                pass

        threading.Thread(target=read, name="snug-attach", daemon=True).start()

    def recount(self, count: Callable[[str], int] | None) -> None:
        """Count the files already in the tray (an edited message's, or any read before a
        model was loaded) with `count`, on a thread."""
        if count is None or not self._files:
            return
        generation, files = self._generation, list(self._files)

        def tally() -> None:
            counted = [(a, _counted(count, a)) for a in files]
            try:
                self._recounted.emit(generation, counted)
            except RuntimeError:  # the window closed meanwhile
                pass

        threading.Thread(target=tally, name="snug-attach-count", daemon=True).start()

    def put(self, attachments: Sequence[Attachment]) -> None:
        """Files already read (an edited message's) back in the tray."""
        self._files.extend(attachments)
        self._tokens.extend([None] * len(attachments))
        self._redraw()

    def take(self) -> list[Attachment]:
        files, self._files, self._tokens = self._files, [], []
        self._generation += 1
        self._redraw()
        return files

    def clear(self) -> None:
        self.take()

    def remove(self, index: int) -> None:
        """Take a file off; `read_done` (none refused) then speaks of the files left."""
        if 0 <= index < len(self._files):
            del self._files[index]
            del self._tokens[index]
            self._redraw()
            self.read_done.emit([])

    def _arrived(self, generation: int, got: list, refused: list) -> None:
        self._reading -= 1
        if generation == self._generation:
            self._files.extend(a for a, _n in got)
            self._tokens.extend(n for _a, n in got)
            self._redraw()
        elif got:
            self.read_for_before.emit(generation, [a for a, _n in got])
        self.read_done.emit(refused)

    def _counts_arrived(self, generation: int, counted: list) -> None:
        if generation != self._generation:
            return  # the files went with a message meanwhile
        by_file = {id(a): n for a, n in counted}
        self._tokens = [
            by_file.get(id(a), n) for a, n in zip(self._files, self._tokens, strict=True)
        ]
        self._redraw()
        self.read_done.emit([])

    def _redraw(self) -> None:
        while self._layout.count():
            chip = self._layout.takeAt(0).widget()
            if chip is not None:
                chip.hide()  # gone from view now; deleted when the event loop comes round
                chip.deleteLater()
        for i, (attachment, tokens) in enumerate(zip(self._files, self._tokens, strict=True)):
            chip = QWidget()
            chip.setObjectName("attachmentChip")
            row = QHBoxLayout(chip)
            row.setContentsMargins(8, 2, 2, 2)
            row.setSpacing(2)
            text = attachment.summary() + (f" · {tokens:,} tokens" if tokens else "")
            label = QLabel()
            label.setTextFormat(Qt.TextFormat.PlainText)
            shown = label.fontMetrics().elidedText(text, Qt.TextElideMode.ElideMiddle, CHIP_PX)
            label.setText(shown)
            tip = preview(attachment)
            label.setToolTip(plain_tip(tip if shown == text else f"{text}\n\n{tip}"))
            drop = QToolButton()
            drop.setObjectName("removeAttachment")
            drop.setText("×")
            drop.setToolTip(f"Take {attachment.name} off this message")
            drop.setAccessibleName(f"Remove {attachment.name}")  # a screen reader's "×"
            drop.clicked.connect(lambda _=False, i=i: self.remove(i))
            row.addWidget(label)
            row.addWidget(drop)
            self._layout.insertWidget(i, chip)
            chip.show()  # now, not when the layout's queued show comes round
        self.setVisible(bool(self._files))
        self._fit()

    def _fit(self) -> None:
        """As tall as the chips' lines at the tray's width, up to TRAY_PX."""
        bar = self._scroll.verticalScrollBar()
        need = self._layout.heightForWidth(max(1, self.width()))
        if need > TRAY_PX:  # the chips are laid out beside the scroll bar
            need = self._layout.heightForWidth(max(1, self.width() - bar.sizeHint().width()))
        self._scroll.setFixedHeight(min(need, TRAY_PX))

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit()  # narrower: the chips take more lines


def _counted(count: Callable[[str], int] | None, attachment: Attachment) -> int | None:
    """The file's tokens as the model reads it (fenced under its name), or None."""
    if count is None:
        return None
    try:
        return count(compose("", [attachment]))
    except Exception:  # a tokenizer that fails here fails again, by name, when it is sent
        return None


def preview(attachment: Attachment, lines: int = 12) -> str:
    """The file's first lines, for a tooltip."""
    head = attachment.text.split("\n", lines)
    more = len(head) > lines
    text = "\n".join(head[:lines])[:1200]
    return text + ("\n…" if more else "")
