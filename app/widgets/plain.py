"""Tooltips that show their text as the characters it is. Qt reads a tooltip that looks like
HTML (`<div>`, `a < b and c > d`, an attached HTML file's first lines) as HTML: its tags
would vanish, or be drawn. Labels showing such text take Qt.TextFormat.PlainText instead."""

from __future__ import annotations

import html

from PySide6.QtGui import Qt


def plain_tip(text: str) -> str:
    """`text` as a tooltip that shows it as written: escaped, its lines and spaces kept,
    where Qt would read it as HTML; else as it is."""
    if not Qt.mightBeRichText(text):
        return text
    return f"<p style='white-space:pre-wrap'>{html.escape(text, quote=False)}</p>"
