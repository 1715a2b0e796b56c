"""The chat list's headings ("Pinned", then app/dates.py's date groups: "Today", "Yesterday",
..., each month), each drawn above the first chat of its group.

The headings are drawn by the list's delegate, not listed as items of their own: the list
holds one item a chat, so the keyboard, the search and Delete move from chat to chat and a
heading can never be selected, renamed or deleted."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QFont, QPainter, QPalette
from PySide6.QtWidgets import QStyledItemDelegate, QStyleOptionViewItem, QWidget

# An item's group heading where it is the first chat of its group, else None.
GROUP_ROLE = Qt.ItemDataRole.UserRole + 1
HEADING_PX = 26  # the heading's band above its first chat
Index = QModelIndex | QPersistentModelIndex


class GroupHeadings(QStyledItemDelegate):
    """Draws an item's group heading (GROUP_ROLE) in a band above the item itself, and
    knows the item whose title is being renamed in place (`editing`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.editing: QPersistentModelIndex | None = None

    def createEditor(  # noqa: N802 (Qt override)
        self, parent: QWidget, option: QStyleOptionViewItem, index: Index
    ) -> QWidget:
        editor = super().createEditor(parent, option, index)
        self.editing = QPersistentModelIndex(index)
        return editor

    def destroyEditor(self, editor: QWidget, index: Index) -> None:  # noqa: N802 (Qt override)
        self.editing = None
        super().destroyEditor(editor, index)

    @staticmethod
    def _heading(index: Index) -> str | None:
        return index.data(GROUP_ROLE) or None

    @staticmethod
    def _below(rect: QRect) -> QRect:
        return rect.adjusted(0, HEADING_PX, 0, 0)

    def sizeHint(self, option: QStyleOptionViewItem, index: Index) -> QSize:  # noqa: N802
        size = super().sizeHint(option, index)
        if self._heading(index):
            size.setHeight(size.height() + HEADING_PX)
        return size

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: Index) -> None:
        heading = self._heading(index)
        if heading is None:
            super().paint(painter, option, index)
            return
        rect = option.rect
        band = QRect(rect.left() + 8, rect.top(), rect.width() - 16, HEADING_PX)
        painter.save()
        font = QFont(option.font)
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.85))
        font.setBold(True)
        painter.setFont(font)
        painter.setPen(option.palette.color(QPalette.ColorRole.PlaceholderText))
        align = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignBottom
        painter.drawText(band.adjusted(0, 0, 0, -4), int(align), heading)
        painter.restore()
        item = QStyleOptionViewItem(option)
        item.rect = self._below(option.rect)
        super().paint(painter, item, index)

    def updateEditorGeometry(  # noqa: N802 (Qt override): a title renamed in place
        self, editor: QWidget, option: QStyleOptionViewItem, index: Index
    ) -> None:
        super().updateEditorGeometry(editor, option, index)
        if self._heading(index):
            editor.setGeometry(self._below(editor.geometry()))
