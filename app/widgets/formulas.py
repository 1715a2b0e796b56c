"""The formulas of a message drawn into its document: each mark `with_marks` left in the
Markdown (app/math_spans.py) replaced by the formula as Qt rich text (app/math_render.py);
a displayed formula alone in its paragraph is centred there."""

from __future__ import annotations

from PySide6.QtCore import QRegularExpression, Qt
from PySide6.QtGui import QFont, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

from app.math_render import to_html
from app.math_spans import MARK, MARK_CLOSE, MARK_OPEN, Formula

_FIND = QRegularExpression(MARK.pattern)


def _around(doc: QTextDocument, start: int) -> QTextCharFormat:
    """What a formula in a line takes of the text around it: a heading's size, bold, a
    link (its target, colour and underline)."""
    probe = QTextCursor(doc)
    probe.setPosition(start + 1)  # the format of the mark's first character
    outer, merge = probe.charFormat(), QTextCharFormat()
    if outer.fontPointSize() > 0:
        merge.setFontPointSize(outer.fontPointSize())
    if outer.hasProperty(QTextFormat.Property.FontSizeAdjustment):  # a Markdown heading's
        merge.setProperty(
            QTextFormat.Property.FontSizeAdjustment,
            outer.intProperty(QTextFormat.Property.FontSizeAdjustment),
        )
    if outer.fontWeight() > QFont.Weight.Normal:
        merge.setFontWeight(outer.fontWeight())
    if outer.isAnchor():
        merge.setAnchor(True)
        merge.setAnchorHref(outer.anchorHref())
        merge.setForeground(outer.foreground())
        merge.setFontUnderline(outer.fontUnderline())
    return merge


def draw_formulas(doc: QTextDocument, markdown: str, found: list[Formula], ink: str) -> None:
    """Replace each formula's mark in `doc` (read from marked Markdown) with the formula;
    `markdown` is the text the formulas were taken from (for one that cannot be drawn),
    `ink` the text's colour (a fraction's bar)."""
    if not found:
        return
    edit = QTextCursor(doc)
    edit.beginEditBlock()
    cursor = doc.find(_FIND, 0)
    while not cursor.isNull():
        n = int(cursor.selectedText()[len(MARK_OPEN) : -len(MARK_CLOSE)])
        formula = found[n] if n < len(found) else None
        if formula is not None:
            alone = cursor.block().text().strip() == cursor.selectedText()
            source = markdown[formula.start : formula.end]
            start = cursor.selectionStart()
            around = _around(doc, start)
            cursor.insertHtml(to_html(formula.tex, formula.display and alone, source, ink))
            if not formula.display or not alone:
                inserted = QTextCursor(doc)
                inserted.setPosition(start)
                inserted.setPosition(cursor.position(), QTextCursor.MoveMode.KeepAnchor)
                inserted.mergeCharFormat(around)
            if formula.display and alone:
                centre = QTextCursor(doc)
                centre.setPosition(start)
                fmt = centre.blockFormat()
                fmt.setAlignment(Qt.AlignmentFlag.AlignHCenter)
                centre.setBlockFormat(fmt)
        cursor = doc.find(_FIND, cursor.position())
    edit.endEditBlock()
