"""TeX math in a message: found where models write it, as Pandoc finds it
(app/math_spans.py), drawn as Qt rich text from latex2mathml's reading
(app/math_render.py), and shown in the message view in place of the Markdown that Qt's
reader would have mangled (`\\(` read as an escaped parenthesis, `a*b*c` made italic)."""

from __future__ import annotations

import re
import string

from fake_engine import FakeEngine
from hypothesis import given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.engine_bridge import LoadRequest
from app.math_render import to_html
from app.math_spans import MARK, formulas, with_marks
from app.widgets.message import AutoHeightBrowser


def found(markdown: str) -> list[tuple[str, bool]]:
    return [(f.tex, f.display) for f in formulas(markdown)]


def text_of(rich: str) -> str:
    """Rich text's characters, tags dropped and entities read."""
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", rich)).replace("\xa0", " ")


def test_formulas_are_found_by_their_delimiters():
    assert found(r"so $x^2$ and \(y\) then") == [("x^2", False), ("y", False)]
    assert found("see\n$$\na = b\n$$\nand \\[ c \\]") == [("\na = b\n", True), (" c ", True)]
    assert found(r"a matrix \[ \begin{pmatrix} 1 \\ 2 \end{pmatrix} \] here") == [
        (r" \begin{pmatrix} 1 \\ 2 \end{pmatrix} ", True)
    ]
    assert found(r"\( a \\) b \)") == [(r" a \\) b ", False)]  # `\\)`: a break, then ")"


def test_prices_and_code_are_not_formulas():
    assert found("It costs $5 and $10, or $20.") == []
    assert found("from $5.00, and the tax is $0.40.") == []
    assert found("$ x $ is not math, nor is \\$x\\$") == []
    assert found("| item | $5 |\n| two | $10 |") == []
    # a letter after the closing `$` is allowed (Pandoc's rule): "the $n$th term"
    assert found("the $n$th term is $a_n$.") == [("n", False), ("a_n", False)]
    assert found("`$x$` and ``a `$y$` b``") == []
    assert found("```\n$x$\n\\(y\\)\n```\n$z$") == [("z", False)]
    assert found("~~~tex\n$$a$$\n~~~") == []
    assert found("$x\n\ny$") == []  # a paragraph ends the formula
    assert found("$$x^2 still streaming") == [] and found(r"\( half") == []


def test_a_displayed_formula_is_a_paragraph_of_its_own():
    marked, got = with_marks("Roots:\n$$x = 1$$\nso.")
    assert [f.tex for f in got] == ["x = 1"]
    assert MARK.search(marked) and "\n\n\ue0000\ue001\n\n" in marked
    # inside a list item it keeps the item's indent; in a table it stays in its cell
    marked, _ = with_marks("1. First $$y$$ then")
    assert "\n   \n   \ue0000\ue001\n" in marked
    marked, _ = with_marks("| a | $$z$$ |")
    assert marked == "| a | \ue0000\ue001 |"
    assert with_marks("no math") == ("no math", [])


def test_formulas_read_as_they_mean():
    inline = text_of(to_html(r"x = \frac{-b \pm \sqrt{b^2 - 4ac}}{2a}", False, "src"))
    assert inline == "x = (−b ± √(b2 − 4ac))/(2a)"
    assert text_of(to_html(r"\frac{n(n+1)}{2}", False, "")) == "(n(n + 1))/2"
    assert text_of(to_html(r"\left( \frac{1}{2} \right)^{10}", False, "")) == "(1/2)10"
    assert text_of(to_html(r"-x + (-3)", False, "")) == "−x + (−3)"  # signs, not operators
    assert text_of(to_html(r"f'(x) = 90^\circ", False, "")) == "f′(x) = 90°"
    assert text_of(to_html(r"\sin x", False, "")) == "sin\u2009x"
    rich = to_html(r"\alpha_t \cdot \mathbf{v} \le \mathbb{R}^n \hat{\theta}", False, "")
    assert "<i>α</i><sub><i>t</i></sub>" in rich and "<b>v</b>" in rich
    assert "ℝ<sup><i>n</i></sup>" in rich and "θ\u0302" in rich
    assert text_of(to_html(r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", False, "")) == (
        "(1, 2; 3, 4)"
    )
    assert text_of(to_html(r"\boxed{42}", False, "")) == "42"
    assert text_of(to_html(r"\text{<b>a & b</b>}", False, "")) == "<b>a & b</b>"  # as text


def test_a_displayed_formula_stacks_its_fractions_and_tables_its_matrices():
    rich = to_html(r"x = \frac{1}{2a}", True, "", "#123456")
    assert "border-bottom-color:#123456" in rich and rich.startswith("<table")
    assert text_of(rich) == "x =12a"  # a cell "x =", then 1 over 2a
    matrix = to_html(r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", True, "")
    assert matrix.count("<tr>") == 3 and matrix.count("<td") == 7  # the brackets beside it
    # scripts stay on the line even in a displayed formula
    assert "/" in text_of(to_html(r"e^{\frac{1}{2}}", True, ""))


def test_a_formula_that_cannot_be_read_keeps_its_source():
    assert to_html("}{", False, "$}{$") == "<code>$}{$</code>"
    assert to_html(r"\begin{x", False, r"\(\begin{x<\)") == "<code>\\(\\begin{x&lt;\\)</code>"
    assert "&lt;" in to_html("a < b", False, "") and "<b " not in to_html("a<b", False, "")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.ascii_letters[:6] + "$\\()[]{}`^_&*|\n 0123456789", max_size=80))
def test_any_text_is_split_cleanly(text):
    got = formulas(text)
    ends = [0] + [f.end for f in got]
    for formula, before in zip(got, ends, strict=False):
        assert formula.start >= before and formula.end > formula.start
        source = text[formula.start : formula.end]
        assert source.startswith(("$", "\\(", "\\[")) and formula.tex in source
        assert isinstance(to_html(formula.tex, formula.display, source), str)
    marked, again = with_marks(text)
    assert again == got and len(MARK.findall(marked)) == len(got)


def test_the_message_view_shows_formulas_not_mangled_markdown(qtbot):
    view = AutoHeightBrowser(copy_links=True)
    qtbot.addWidget(view)
    view.set_markdown(
        "The roots: \\( x = \\frac{a}{b} \\) and $a*b*c$.\n\n$$\ny = 2\n$$\n\n"
        "It costs $5 or $10.\n```\n$kept$\n```"
    )
    text = view.document().toPlainText()
    assert "x = a/b" in text and "a*b*c" in text and "(" not in text.split("\n")[0][:12]
    assert "It costs $5 or $10." in text and "$kept$" in text
    assert "\ue000" not in text
    centred = [b for b in _blocks(view) if b.text() == "y = 2" and b.blockFormat().alignment()]
    assert centred and centred[0].blockFormat().alignment() & Qt.AlignmentFlag.AlignHCenter


def _blocks(view):
    block = view.document().begin()
    while block.isValid():
        yield block
        block = block.next()


def test_a_reply_with_math_copies_as_written(qtbot, make_window):
    script = ["Thinking.</think>\n\n", "The area is $\\pi r^2$:\n\n", "$$A = \\pi r^2$$"]
    window = make_window(loader=FakeEngine.loader(script=script))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("What is the area of a circle?")
    message = window.chat.message_widgets()[-1]
    shown = message.answer_view.toPlainText()
    assert "The area is πr2:" in shown and "A = πr2" in shown
    message.copy()
    assert QGuiApplication.clipboard().text().endswith("$$A = \\pi r^2$$")


def test_a_formula_takes_the_heading_link_or_bold_it_stands_in(qtbot):
    from PySide6.QtGui import QTextCursor, QTextFormat

    view = AutoHeightBrowser()
    qtbot.addWidget(view)
    view.set_markdown("### Step $q$ now\n\n[see $y$](https://example.com/y) and **bold $z$**")
    doc = view.document()

    def format_of(char: str):
        at = doc.toPlainText().index(char)
        cursor = QTextCursor(doc)
        cursor.setPosition(at + 1)
        return cursor.charFormat()

    size = QTextFormat.Property.FontSizeAdjustment
    assert format_of("q").intProperty(size) == format_of("S").intProperty(size) > 0
    assert format_of("y").isAnchor() and format_of("y").anchorHref() == "https://example.com/y"
    assert format_of("z").fontWeight() == format_of("b").fontWeight() > 400


@settings(max_examples=120, deadline=None)
@given(
    st.text(alphabet=string.ascii_letters[:4] + "$\\()[]{}`^_&*|#>-1.\n ", max_size=60),
)
def test_any_text_draws_without_a_mark_left(qapp, text):
    view = AutoHeightBrowser(copy_links=True)
    view.set_markdown(text)
    assert "\ue000" not in view.document().toPlainText()
    view.deleteLater()
