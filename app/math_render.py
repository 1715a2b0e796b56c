"""TeX math drawn as Qt rich text: letters in italic, scripts raised and lowered, symbols as
their Unicode characters, a displayed matrix or a set of aligned lines as a table.

latex2mathml reads the TeX (its macros, environments, symbol table) into MathML; Qt's
text engine does not show MathML, so this walks the MathML into the HTML subset Qt's rich
text takes (`<i>`, `<sup>`, `<sub>`, tables). That walk is written here: no library turns
MathML into Qt's HTML. A fraction is written on one line, `a/b`, its parts in parentheses
where they hold more than one term (`(x + 1)/(2a)`), so the formula reads as it means;
a formula that cannot be read (not TeX, a macro latex2mathml does not know) keeps its
source, as written, in a code font.
"""

from __future__ import annotations

import html
import logging
import re
import unicodedata
import xml.etree.ElementTree as ET
from functools import lru_cache

log = logging.getLogger(__name__)

_NS = "{http://www.w3.org/1998/Math/MathML}"
# Binary operators and relations: a space either side, unless one opens its row (a sign).
_SPACED = set("=+−±∓×÷·<>≤≥≠≈≡∼≃≅∝→←↔⇒⇐⇔⟹⟸⟺↦∈∉∋⊂⊃⊆⊇∪∩∧∨∖≪≫≺≻⊕⊗∣")
_OPENERS = set("([{⟨|‖⌊⌈")
# Accents over one character: the combining mark that puts them there.
_ACCENTS = {
    "^": "\u0302",
    "ˆ": "\u0302",
    "~": "\u0303",
    "˜": "\u0303",
    "¯": "\u0304",
    "―": "\u0305",
    "‾": "\u0305",
    "→": "\u20d7",
    "˙": "\u0307",
    "¨": "\u0308",
    "ˇ": "\u030c",
    "˘": "\u0306",
    "´": "\u0301",
    "`": "\u0300",
}
_PRIMES = set("′″‴")


@lru_cache(maxsize=4096)  # a long reply is drawn again as it grows
def to_html(tex: str, display: bool, source: str, ink: str = "#000000") -> str:
    """`tex` as Qt rich text (display: a formula of its own, where fractions stack and a
    matrix is a table; `ink`: the text's colour, for a fraction's bar); `source` (the
    formula as written, delimiters and all) where it cannot be read."""
    try:
        from latex2mathml.converter import convert

        mathml = convert(tex, display="block" if display else "inline")
        root = ET.fromstring(_TOKEN.sub(_escaped, mathml))
        out = _Writer(display, ink).node(root)
    except Exception as exc:  # latex2mathml raises its own and Python's on input it refuses
        log.debug("formula left as written (%s): %.80s", type(exc).__name__, tex)
        return f"<code>{html.escape(source)}</code>"
    return out if out.strip() else f"<code>{html.escape(source)}</code>"


# latex2mathml writes a token's text as the TeX had it: `\text{a & b}` or `\text{<b>}`
# (and `aligned`'s alignment points, a bare `&`) would not be XML.
_TOKEN = re.compile(r"<(mi|mn|mo|mtext|ms)(\s[^>]*)?>(.*?)</\1>", re.DOTALL)


def _escaped(token: re.Match[str]) -> str:
    name, attrs, text = token.group(1), token.group(2) or "", token.group(3)
    text = re.sub(r"&(?!#?\w+;)", "&amp;", text).replace("<", "&lt;").replace(">", "&gt;")
    return f"<{name}{attrs}>{text}</{name}>"


class _Writer:
    """One formula's MathML written out; tables only at a displayed formula's top level."""

    def __init__(self, display: bool, ink: str) -> None:
        self.display, self.ink = display, ink
        self.flat = 0  # inside a script, a root or a table: everything on the line

    @property
    def stacking(self) -> bool:
        """Whether a fraction here stacks and a matrix is a table (a displayed formula's
        own terms, not its scripts)."""
        return self.display and self.flat == 0

    def node(self, el: ET.Element) -> str:
        tag = el.tag.removeprefix(_NS)
        on_line = tag in _ON_LINE
        self.flat += on_line
        try:
            method = getattr(self, f"_{tag}", None)
            return method(el) if method is not None else self._row(el)
        finally:
            self.flat -= on_line

    # ----- rows ----------------------------------------------------------------------------
    def _row(self, el: ET.Element) -> str:
        parts, previous = [], None
        children = list(el)
        for i, child in enumerate(children):
            tag, token = child.tag.removeprefix(_NS), (child.text or "").strip()
            text = self.node(child)
            after = children[i + 1] if i + 1 < len(children) else None
            if _operator(child) and after is not None and _flat(after)[:1] not in _OPENERS:
                text += "\u2009"  # sin x, ∑ᵢ xᵢ: a thin space before the operand
            if tag in ("mo", "mi") and token in _SPACED:
                sign = previous is None or previous == "op"
                text = text if sign else f" {text} "
                previous = "op"
            elif tag == "mo" and token == ",":
                text, previous = ", ", "op"
            elif tag == "mo" and token in _OPENERS:
                previous = "op"  # a sign may follow: (−3)
            else:
                previous = "term" if text.strip() else previous
            parts.append(text)
        if self.stacking and any(p.startswith("<table") for p in parts):
            filled = [p for p in parts if p.strip()]
            return filled[0] if len(filled) == 1 else _cells(parts)
        return "".join(parts).replace("  ", " ")

    _math = _mrow = _mstyle = _mpadded = _semantics = _row

    def _mphantom(self, el: ET.Element) -> str:
        return ""

    def _annotation(self, el: ET.Element) -> str:
        return ""

    # ----- tokens ---------------------------------------------------------------------------
    def _mi(self, el: ET.Element) -> str:
        text = el.text or ""
        if text == "&":  # an alignment point of `aligned`
            return ""
        return "".join(_letter(c, single=len(text) == 1) for c in text)

    def _mn(self, el: ET.Element) -> str:
        return html.escape(el.text or "")

    def _mo(self, el: ET.Element) -> str:
        return html.escape((el.text or "").strip())

    def _mtext(self, el: ET.Element) -> str:
        text = html.escape(el.text or "")
        return f"<b>{text}</b>" if el.get("mathvariant") == "bold" else text

    def _ms(self, el: ET.Element) -> str:
        return html.escape(f'"{el.text or ""}"')

    def _mspace(self, el: ET.Element) -> str:
        if el.get("linebreak") == "newline":
            return "<br/>"
        width = el.get("width", "")
        try:
            em = float(width.removesuffix("em")) if width.endswith("em") else 0.0
        except ValueError:
            em = 0.0
        return "\u2003" if em >= 1 else "\u2009" if em > 0 else ""

    # ----- scripts ----------------------------------------------------------------------------
    def _msup(self, el: ET.Element) -> str:
        base, sup = _two(el)
        return self.node(base) + self._raised(sup)

    def _msub(self, el: ET.Element) -> str:
        base, sub = _two(el)
        return f"{self.node(base)}<sub>{self.node(sub)}</sub>"

    def _msubsup(self, el: ET.Element) -> str:
        base, sub, sup = _three(el)
        return f"{self.node(base)}<sub>{self.node(sub)}</sub>{self._raised(sup)}"

    def _raised(self, sup: ET.Element) -> str:
        text = _flat(sup)
        if text and set(text) <= _PRIMES:  # f′: the prime on the line, as printed
            return text
        if text == "∘":  # 90^\circ: a degree sign
            return "°"
        return f"<sup>{self.node(sup)}</sup>"

    def _munder(self, el: ET.Element) -> str:
        base, under = _two(el)
        mark = _flat(under)
        if mark in ("―", "_", "‾") and len(_flat(base)) >= 1:  # \underline
            return f"<u>{self.node(base)}</u>"
        if mark == "⏟":  # \underbrace: what is under it follows as a subscript
            return self.node(base)
        return f"{self.node(base)}<sub>{self.node(under)}</sub>"

    def _mover(self, el: ET.Element) -> str:
        base, over = _two(el)
        mark, text = _flat(over), _flat(base)
        combining = _ACCENTS.get(mark)
        if combining is not None and len(text) == 1:
            return _letter(text + combining, single=True)
        if combining is not None and mark in ("―", "‾", "¯"):  # \overline{AB}: each letter
            return "".join(_letter(c + "\u0305", single=True) for c in text)
        if combining is not None:
            return f"{self.node(base)}<sup>{html.escape(mark)}</sup>"
        return f"{self.node(base)}<sup>{self.node(over)}</sup>"

    def _munderover(self, el: ET.Element) -> str:
        base, under, over = _three(el)
        return f"{self.node(base)}<sub>{self.node(under)}</sub><sup>{self.node(over)}</sup>"

    # ----- fractions and roots -----------------------------------------------------------------
    def _mfrac(self, el: ET.Element) -> str:
        top, bottom = _two(el)
        if el.get("linethickness") == "0":  # \binom: n over k, in the parentheses around it
            return f"<sup>{self.node(top)}</sup><sub>{self.node(bottom)}</sub>"
        if self.stacking:
            bar = "border-bottom-width:1px; border-bottom-style:solid; "
            bar += f"border-bottom-color:{self.ink}"
            return (
                '<table cellspacing="0" cellpadding="1">'
                f'<tr><td align="center" style="{bar}">{self.node(top)}</td></tr>'
                f'<tr><td align="center">{self.node(bottom)}</td></tr></table>'
            )
        return f"{self._operand(top)}/{self._operand(bottom)}"

    def _operand(self, el: ET.Element) -> str:
        text = self.node(el)
        return text if _atomic(el) else f"({text})"

    def _msqrt(self, el: ET.Element) -> str:
        inner = el[0] if len(el) == 1 else el
        return "√" + self._operand(inner)

    def _mroot(self, el: ET.Element) -> str:
        base, index = _two(el)
        return f"<sup>{self.node(index)}</sup>√{self._operand(base)}"

    def _menclose(self, el: ET.Element) -> str:  # \boxed: the answer, in bold
        return f"<b>{self._row(el)}</b>"

    # ----- tables ----------------------------------------------------------------------------
    def _mtable(self, el: ET.Element) -> str:
        stacking = self.stacking
        self.flat += 1
        try:
            rows = [[self._row(cell) for cell in row] for row in el]
        finally:
            self.flat -= 1
        if not stacking:  # on the line: rows by semicolons, in the brackets around it
            return "; ".join(", ".join(cells) for cells in rows)
        body = []
        for row, cells in zip(el, rows, strict=True):
            tds = []
            for cell, text in zip(row, cells, strict=True):
                align = cell.get("columnalign", "center")
                tds.append(f'<td align="{html.escape(align)}">{text}</td>')
            body.append("<tr>" + "".join(tds) + "</tr>")
        return '<table cellspacing="0" cellpadding="3">' + "".join(body) + "</table>"

    def _mtr(self, el: ET.Element) -> str:
        return ", ".join(self._row(cell) for cell in el)

    _mlabeledtr = _mtr


def _cells(parts: list[str]) -> str:
    """A displayed row that holds a table (a matrix, cases) as one row of cells, so that
    its brackets and the terms around it stand beside the table, not above and below; a
    bracket next to the table gets a cell of its own, drawn large."""
    cells, text = [], ""
    for part in parts:
        if part.startswith("<table"):
            text = text.strip()
            if text[-1:] in _OPENERS:
                cells += [_side(text[:-1]), _side(text[-1])]
            else:
                cells.append(_side(text))
            cells.append(f'<td valign="middle">{part}</td>')
            text = ""
        else:
            text += part
    text = text.strip()
    if text and text[0] in ")]}⟩|‖⌋⌉":
        cells += [_side(text[0]), _side(text[1:])]
    else:
        cells.append(_side(text))
    row = "".join(cell for cell in cells if cell)
    return f'<table align="center" cellspacing="0" cellpadding="2"><tr>{row}</tr></table>'


def _side(text: str) -> str:
    """A cell beside a table ("" for no text); a lone bracket drawn large."""
    text = text.strip()
    if not text:
        return ""
    if len(text) == 1 and text in _OPENERS | set(")]}⟩⌋⌉"):
        text = f'<span style="font-size:x-large">{text}</span>'
    return f'<td valign="middle">{text}</td>'


# Elements whose parts stay on the line, even in a displayed formula.
_ON_LINE = {"msup", "msub", "msubsup", "munder", "mover", "munderover", "msqrt", "mroot"}
_LARGE = set("∑∏∐∫∬∭∮⋃⋂⨁⨂")


def _operator(el: ET.Element) -> bool:
    """Whether `el` is a named function or a large operator (with its limits): `sin`,
    `lim` under its limit, ∑ with its range."""
    tag = el.tag.removeprefix(_NS)
    if tag in ("msub", "msup", "msubsup", "munder", "mover", "munderover") and len(el):
        return _operator(el[0]) or _flat(el[0]) in _LARGE
    text = (el.text or "").strip()
    return tag in ("mi", "mo") and len(text) > 1 and text.isalpha()


def _two(el: ET.Element) -> tuple[ET.Element, ET.Element]:
    if len(el) < 2:
        raise ValueError(f"<{el.tag}> with {len(el)} parts")
    return el[0], el[1]


def _three(el: ET.Element) -> tuple[ET.Element, ET.Element, ET.Element]:
    if len(el) < 3:
        raise ValueError(f"<{el.tag}> with {len(el)} parts")
    return el[0], el[1], el[2]


def _flat(el: ET.Element) -> str:
    """An element's characters, markup aside."""
    return "".join(el.itertext()).strip()


def _atomic(el: ET.Element) -> bool:
    """Whether `el` reads as one term next to `/` or `√`: a number, a letter, a name, a
    script on one of those, a root, or something already in brackets."""
    tag = el.tag.removeprefix(_NS)
    if tag in ("mrow", "mstyle") and len(el) == 1:
        return _atomic(el[0])
    if tag in ("mi", "mn", "mtext", "msqrt", "mroot"):
        return True
    if tag in ("msup", "msub", "msubsup") and len(el):
        return _atomic(el[0])
    if tag == "mrow" and len(el) >= 2:
        first, last = _flat(el[0]), _flat(el[-1])
        return first in _OPENERS and first != "|" and last in ")]}⟩⌋⌉" and _one_group(el)
    return False


def _one_group(el: ET.Element) -> bool:
    """Whether the first bracket of a row closes at its end (`(a)(b)` is two groups)."""
    depth = 0
    for i, child in enumerate(el):
        text = _flat(child)
        if child.tag.removeprefix(_NS) == "mo" and text in "([{⟨⌊⌈":
            depth += 1
        elif child.tag.removeprefix(_NS) == "mo" and text in ")]}⟩⌋⌉":
            depth -= 1
            if depth == 0 and i != len(el) - 1:
                return False
    return True


def _letter(text: str, single: bool) -> str:
    """A token's characters: a lone Latin letter (or lowercase Greek) in italic, as TeX sets
    it; a letter from Unicode's mathematical alphabets as its plain letter, styled (fonts
    have the plain ones); anything else as it is."""
    base = text[0]
    name = unicodedata.name(base, "")
    if name.startswith("MATHEMATICAL "):
        plain = _plain(name)
        if plain is not None:
            style = name.removeprefix("MATHEMATICAL ")
            escaped = html.escape(plain + text[1:])
            if style.startswith("BOLD ITALIC"):
                return f"<b><i>{escaped}</i></b>"
            if style.startswith("BOLD "):
                return f"<b>{escaped}</b>"
            if style.startswith("ITALIC "):
                return f"<i>{escaped}</i>"
    escaped = html.escape(text)
    italic = single and (
        ("a" <= base <= "z" or "A" <= base <= "Z") or ("α" <= base <= "ω" and base != "π")
    )
    return f"<i>{escaped}</i>" if italic else escaped


def _plain(name: str) -> str | None:
    """The plain letter or digit behind a mathematical one ("MATHEMATICAL BOLD SMALL V":
    "v"), where Unicode has one by that name; None for styles fonts draw differently."""
    words = name.split()
    if len(words) < 3 or not any(w in ("BOLD", "ITALIC") for w in words[1:3]):
        return None
    tail = [w for w in words[1:] if w not in ("BOLD", "ITALIC")]
    if tail[:1] == ["DIGIT"]:
        candidates = ["DIGIT " + " ".join(tail[1:])]
    elif tail[:1] in (["CAPITAL"], ["SMALL"]) and len(tail) >= 2:
        letter = " ".join(tail[1:])
        candidates = [f"{script} {tail[0]} LETTER {letter}" for script in ("LATIN", "GREEK")]
    else:
        return None
    for candidate in candidates:
        try:
            return unicodedata.lookup(candidate)
        except KeyError:
            continue
    return None
