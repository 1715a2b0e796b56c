"""The formulas of a message drawn into its document: each mark `with_marks` left in the
Markdown (app/math_spans.py) replaced by the formula as Qt rich text (app/math_render.py);
a displayed formula alone in its paragraph is centred there."""

from __future__ import annotations

from PySide6.QtCore import QRegularExpression, Qt
from PySide6.QtGui import QTextCursor, QTextDocument

from app.math_render import to_html
from app.math_spans import MARK, MARK_CLOSE, MARK_OPEN, Formula

_FIND = QRegularExpression(MARK.pattern)


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
            cursor.insertHtml(to_html(formula.tex, formula.display and alone, source, ink))
            if formula.display and alone:
                centre = QTextCursor(doc)
                centre.setPosition(start)
                fmt = centre.blockFormat()
                fmt.setAlignment(Qt.AlignmentFlag.AlignHCenter)
                centre.setBlockFormat(fmt)
        cursor = doc.find(_FIND, cursor.position())
    edit.endEditBlock()
