"""Code blocks in a message, coloured by their language with Pygments.

Qt reads a message's Markdown into a QTextDocument and marks each line of a fenced code
block with the fence's language (`BlockCodeLanguage`); `colour_code` finds each block's
lines, has Pygments' lexer for that language split the code into tokens, and gives the
tokens the colours of a Pygments style made for the theme's background. A block whose
language Pygments does not know, or that names none, stays plain, as does one longer than
MAX_CHARS (a reply is drawn again as it streams in; `runs` keeps the colours of the blocks
it has seen, so only the block still growing is lexed again).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import accumulate

from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

MAX_CHARS = 30_000  # longer blocks are shown plain: lexing one takes 50 ms and more a redraw
STYLES = {False: "default", True: "github-dark"}  # Pygments' styles for light, dark


@dataclass(frozen=True)
class Run:
    """Characters `start` to `start + length` of a block's code in one token colour."""

    start: int
    length: int
    colour: str
    bold: bool = False
    italic: bool = False


@functools.lru_cache(maxsize=64)
def _lexer(language: str):
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(language)
    except ClassNotFound:
        return None


@functools.lru_cache(maxsize=4)
def _style(dark: bool):
    from pygments.styles import get_style_by_name

    return get_style_by_name(STYLES[dark])


@functools.lru_cache(maxsize=256)
def runs(language: str, code: str, dark: bool) -> tuple[Run, ...]:
    """The coloured runs of `code` in `language` (a fence's info string: its first word
    names the language, as `python`, `js`, `c++`), neighbours of one colour joined; none
    where the language is unknown or the code too long."""
    name = language.split()[0].lower() if language.strip() else ""
    lexer = _lexer(name) if name and len(code) <= MAX_CHARS else None
    if lexer is None:
        return ()
    style, out = _style(dark), []
    for start, kind, value in lexer.get_tokens_unprocessed(code):
        spec = style.style_for_token(kind)
        if value.isspace() or not (spec["color"] or spec["bold"] or spec["italic"]):
            continue  # spaces show no colour (nor does the text's own)
        colour = f"#{spec['color']}" if spec["color"] else ""
        last = out[-1] if out else None
        if (
            last is not None
            and last.start + last.length == start
            and (last.colour, last.bold, last.italic) == (colour, spec["bold"], spec["italic"])
        ):
            out[-1] = Run(last.start, last.length + len(value), colour, last.bold, last.italic)
        else:
            out.append(Run(start, len(value), colour, spec["bold"], spec["italic"]))
    return tuple(out)


def code_blocks(doc: QTextDocument) -> list[tuple[int, str, str]]:
    """(position, language, code) of each code block in `doc`: a run of lines Qt marked as
    one fence's (the same language and fence), their text joined by line breaks, which is
    how the document counts positions across them."""
    out: list[tuple[int, str, str]] = []
    key, start, lines = None, 0, []
    block = doc.begin()
    while True:
        fmt = block.blockFormat() if block.isValid() else None
        this = None
        if fmt is not None and fmt.nonBreakableLines():
            language = fmt.property(QTextFormat.Property.BlockCodeLanguage)
            fence = fmt.property(QTextFormat.Property.BlockCodeFence)
            this = (language or "", fence or "")
        if this != key or this is None:
            if key is not None:
                out.append((start, key[0], "\n".join(lines)))
            key, lines = this, []
            start = block.position() if block.isValid() else 0
        if not block.isValid():
            return out
        if this is not None:
            lines.append(block.text())
        block = block.next()


def colour_code(doc: QTextDocument, cursor: QTextCursor, dark: bool) -> None:
    """Colour `doc`'s code blocks (`cursor` on it, inside the caller's edit block)."""
    for position, language, code in code_blocks(doc):
        units = _utf16_offsets(code)
        for run in runs(language, code, dark):
            start, end = run.start, run.start + run.length
            if units is not None:
                start, end = units[start], units[end]
            cursor.setPosition(position + start)
            cursor.setPosition(position + end, QTextCursor.MoveMode.KeepAnchor)
            fmt = QTextCharFormat()
            if run.colour:
                fmt.setForeground(QColor(run.colour))
            if run.bold:
                fmt.setFontWeight(QFont.Weight.Bold)
            if run.italic:
                fmt.setFontItalic(True)
            cursor.mergeCharFormat(fmt)


def _utf16_offsets(code: str) -> list[int] | None:
    """Where each character of `code` starts in the document, which counts UTF-16 units (a
    character past U+FFFF, as most emoji, takes two); None where every one takes one."""
    if all(ord(c) <= 0xFFFF for c in code):
        return None
    return list(accumulate((2 if ord(c) > 0xFFFF else 1 for c in code), initial=0))
