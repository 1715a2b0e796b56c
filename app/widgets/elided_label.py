"""A one-line label that takes the width it is given, not the width of its text."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

from app.widgets.plain import plain_tip


class ElidedLabel(QLabel):
    """A text too long for the label ends in "…", the whole of it in the tooltip; `text()`
    is the whole text, shown as the characters it is (a title like "Why is <div> a block?"
    is not read as HTML). A long text (a chat's title of 80 characters) never widens the
    window's column, nor pushes the widgets beside it aside."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._whole = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt override)
        self._whole = text
        self._elide()

    def text(self) -> str:
        return self._whole

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._elide()

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 (Qt override)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._elide()  # another size of text (the theme's style sheet)

    def _elide(self) -> None:
        room = max(0, self.contentsRect().width())
        shown = self.fontMetrics().elidedText(self._whole, Qt.TextElideMode.ElideRight, room)
        if shown != super().text():
            super().setText(shown)
        self.setToolTip(plain_tip(self._whole) if shown != self._whole else "")
