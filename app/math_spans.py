"""Where a message's Markdown holds TeX math: `$...$` and `\\(...\\)` inline, `$$...$$` and
`\\[...\\]` displayed, as models write it (Qwen3.5 answers any sum in these).

Qt's Markdown reader knows no math: it would read `\\(` as an escaped parenthesis and drop
the backslash, halve a matrix's `\\\\`, and make `a*b*c` italic. So each formula is taken out
of the Markdown before Qt reads it, in its place a mark (`with_marks`), and drawn in after
(app/math_render.py). The delimiters are read as Pandoc reads them, so a price is not a
formula: a `$` opens inline math only before a non-space, closes it only after a non-space
and not before a digit ("$5 and $10" is text), and never across a blank line. Nothing
inside a code block or an inline code span is math. A formula still open (a reply streaming
in) stays text until its closing delimiter comes.

Written here, not taken from a library: the Markdown is Qt's to read, and a Markdown
library's math extension would read it with its own rules, not alongside Qt's.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from app.code_blocks import code_blocks

# A formula's mark in the Markdown Qt reads: private-use characters around its number, which
# no Markdown rule touches and no model writes.
MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"
MARK = re.compile(f"{MARK_OPEN}(\\d+){MARK_CLOSE}")
MAX_FORMULA = 4000  # characters; a longer span is left as the text it is

_BLANK_LINE = re.compile(r"\n[ \t]*\n")
# What opens a line inside a quote or a list item: `> `, `- `, `1. `, indents.
_CONTAINER = re.compile(r"(?:[ \t]*(?:>|[-*+](?=[ \t])|\d{1,9}[.)](?=[ \t]))?)*[ \t]*")


@dataclass(frozen=True)
class Formula:
    start: int  # the opening delimiter's index in the Markdown
    end: int  # one past the closing delimiter
    tex: str  # what is between the delimiters
    display: bool  # `$$` or `\[`: a formula of its own


def formulas(markdown: str) -> list[Formula]:
    """Every formula in `markdown`, in order, outside code."""
    out: list[Formula] = []
    blanks = [m.start() for m in _BLANK_LINE.finditer(markdown)]  # where paragraphs end
    for start, end in _prose(markdown):
        out += _scan(markdown, start, end, blanks)
    return out


def with_marks(markdown: str) -> tuple[str, list[Formula]]:
    """`markdown` with each formula replaced by its mark (`MARK`, numbered from 0), and the
    formulas. A displayed formula's mark is a paragraph of its own (inside the list item or
    quote it is written in), as TeX sets it; in a table row it stays in its cell."""
    found = formulas(markdown)
    if not found:
        return markdown, []
    parts, at = [], 0
    for n, formula in enumerate(found):
        mark = f"{MARK_OPEN}{n}{MARK_CLOSE}"
        if formula.display:
            mark = _paragraph(markdown, formula.start, mark)
        parts += [markdown[at : formula.start], mark]
        at = formula.end
    parts.append(markdown[at:])
    return "".join(parts), found


def _paragraph(markdown: str, start: int, mark: str) -> str:
    """`mark` set apart by blank lines, each line taking the container prefix (quote
    markers, a list item's indent) of the line the formula starts on."""
    line = markdown[markdown.rfind("\n", 0, start) + 1 :]
    line = line[: line.find("\n")] if "\n" in line else line
    if line.lstrip().startswith("|"):  # a table's cell: no paragraphs there
        return mark
    prefix = _CONTAINER.match(line)
    lead = prefix.group(0) if prefix else ""
    lead = re.sub(r"[-*+]|\d{1,9}[.)]", lambda m: " " * len(m.group(0)), lead)
    return f"\n{lead}\n{lead}{mark}\n{lead}\n{lead}"


def _prose(markdown: str) -> list[tuple[int, int]]:
    """The (start, end) index ranges of `markdown` outside fenced code blocks."""
    offsets, at = [], 0
    for line in markdown.split("\n"):
        offsets.append(at)
        at += len(line) + 1
    offsets.append(at)
    ranges, start = [], 0
    for block in code_blocks(markdown):
        ranges.append((start, offsets[block.line]))
        start = offsets[min(block.end + 1, len(offsets) - 1)]
    ranges.append((start, len(markdown)))
    return [(a, min(b, len(markdown))) for a, b in ranges if a < b]


def _scan(text: str, i: int, end: int, blanks: list[int]) -> list[Formula]:
    """The formulas in text[i:end], a stretch without code blocks (inline code skipped)."""
    out = []
    # A `$` that found no closing `$` in its paragraph: none after it there will either
    # (whether a `$` closes depends on it alone), so those are passed without a search.
    unclosed_until = -1
    while i < end:
        c = text[i]
        if c == "`":
            run = _run(text, i, "`")
            close = text.find("`" * run, i + run, end)
            while close != -1 and _run(text, close, "`") != run:  # a longer run is not it
                close = text.find("`" * run, close + _run(text, close, "`"), end)
            i = close + run if close != -1 else i + run
            continue
        if c == "\\" and i + 1 < end:
            pair = text[i + 1]
            if pair in "([":
                closing = "\\)" if pair == "(" else "\\]"
                found = _closed(text, i + 2, end, closing, pair == "(")
                if found is not None:
                    out.append(Formula(i, found + 2, text[i + 2 : found], pair == "["))
                    i = found + 2
                    continue
            i += 2  # an escaped character (`\$` among them) is not a delimiter
            continue
        if c == "$":
            if text.startswith("$$", i):
                formula = _displayed(text, i, end)
            elif i < unclosed_until:
                formula = None
            else:
                formula, unclosed_until = _inline(text, i, end, blanks)
            if formula is not None:
                out.append(formula)
                i = formula.end
                continue
            i += _run(text, i, "$")
            continue
        i += 1
    return out


def _displayed(text: str, i: int, end: int) -> Formula | None:
    """The formula opened by the `$$` at i, if it closes."""
    close = _closed(text, i + 2, end, "$$", inline=False)
    if close is None or not text[i + 2 : close].strip():
        return None
    return Formula(i, close + 2, text[i + 2 : close], True)


def _inline(text: str, i: int, end: int, blanks: list[int]) -> tuple[Formula | None, int]:
    """The formula opened by the `$` at i, if it is one (Pandoc's rules); and, where no
    `$` closes one in the paragraph, where the paragraph ends (else -1). `blanks`: where
    the text's blank lines start."""
    if i + 1 >= end or text[i + 1].isspace():
        return None, -1
    at = bisect.bisect_left(blanks, i)
    stop = min(blanks[at], end) if at < len(blanks) else end
    k = text.find("$", i + 1, stop)
    while k != -1:
        after = text[k + 1] if k + 1 < end else ""
        if text[k - 1] != "\\" and not text[k - 1].isspace() and not after.isdigit():
            if after == "$":  # `$x$$`: not this one's end
                return None, -1
            tex = text[i + 1 : k]
            return (Formula(i, k + 1, tex, False) if len(tex) <= MAX_FORMULA else None), -1
        k = text.find("$", k + 1, stop)
    return None, stop


def _closed(text: str, i: int, end: int, closing: str, inline: bool) -> int | None:
    """The index of `closing` after i (backslash-escaped ones passed), or None: not closed
    within `end`, past MAX_FORMULA, or (inline) past a blank line."""
    j = i
    while True:
        k = text.find(closing, j, end)
        if k == -1 or k - i > MAX_FORMULA:
            return None
        if inline and _BLANK_LINE.search(text, i, k):
            return None
        if closing[0] == "$" and text[k - 1] == "\\":
            j = k + 1
            continue
        if closing[0] == "\\" and _odd_backslashes(text, i, k):
            j = k + 1  # `\\)`: a line break, then a parenthesis, not the close
            continue
        return k


def _odd_backslashes(text: str, start: int, k: int) -> bool:
    """Whether the backslash at k is preceded (from start) by an odd number of others."""
    n = 0
    while k - n - 1 >= start and text[k - n - 1] == "\\":
        n += 1
    return n % 2 == 1


def _run(text: str, i: int, char: str) -> int:
    n = i
    while n < len(text) and text[n] == char:
        n += 1
    return n - i
