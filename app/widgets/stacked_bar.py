"""A horizontal bar of coloured segments (bytes), with an optional marker line and legend."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QGridLayout, QLabel, QSizePolicy, QWidget

from app.planning import fmt_bytes
from app.theme import THEME, colour


class StackedBar(QWidget):
    """Segments are (label, bytes, colour); `total` sets the full width (default: the sum)."""

    def __init__(self, height: int = 18, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._segments: list[tuple[str, int, str]] = []
        self._total = 0
        self._marker: tuple[int, str] | None = None
        self.setFixedHeight(height)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        THEME.changed.connect(self.update)  # painted in the theme's colours

    def set_segments(
        self,
        segments: list[tuple[str, int, str]],
        total: int | None = None,
        marker: tuple[int, str] | None = None,
    ) -> None:
        self._segments = [(n, max(0, int(b)), c) for n, b, c in segments]
        self._total = int(total if total is not None else sum(b for _, b, _ in self._segments))
        self._marker = marker
        tips = [f"{n}: {fmt_bytes(b)}" for n, b, _ in self._segments if b > 0]
        self.setToolTip("\n".join(tips))
        self.update()

    def segments(self) -> list[tuple[str, int, str]]:
        return list(self._segments)

    def paintEvent(self, _event) -> None:  # noqa: N802 (Qt override)
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        rect = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        clip = QPainterPath()
        clip.addRoundedRect(rect, 5, 5)
        p.setClipPath(clip)
        p.fillRect(rect, QColor(colour("#eef1f4")))
        total = max(self._total, 1)
        x = rect.left()
        for _name, nbytes, shade in self._segments:
            w = rect.width() * nbytes / total
            p.fillRect(QRectF(x, rect.top(), w, rect.height()), QColor(colour(shade)))
            x += w
        if self._marker is not None:
            at, shade = self._marker
            mx = rect.left() + rect.width() * min(max(at / total, 0.0), 1.0)
            p.setPen(QPen(QColor(colour(shade)), 2, Qt.PenStyle.DashLine))
            p.drawLine(int(mx), int(rect.top()), int(mx), int(rect.bottom()))
        p.setClipping(False)
        p.setPen(QPen(QColor(colour("#c9d1d9")), 1))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRoundedRect(rect, 5, 5)


class Legend(QWidget):
    """Colour swatch, label and bytes for each segment, in a grid of `columns`.

    The rows are kept and updated in place. Replacing them on every update (the gauge's is
    twice a second) left the new labels hidden: a child added to a visible widget is shown
    by a queued call, and while the event queue was behind, each update replaced the labels
    before that call ran, so the legend stayed empty.
    """

    def __init__(self, columns: int = 2, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._grid.setHorizontalSpacing(10)
        self._grid.setVerticalSpacing(2)
        self._columns = columns
        self._rows: list[tuple[QLabel, QLabel]] = []
        self._colours: list[str] = []
        for col in range(columns):
            self._grid.setColumnStretch(col * 2 + 1, 1)

    def set_items(self, items: list[tuple[str, int, str]]) -> None:
        while len(self._rows) < len(items):
            row, col = divmod(len(self._rows), self._columns)
            swatch = QLabel(self)
            swatch.setFixedSize(10, 10)
            text = QLabel(self)
            text.setObjectName("legendText")
            self._grid.addWidget(swatch, row, col * 2)
            self._grid.addWidget(text, row, col * 2 + 1)
            self._rows.append((swatch, text))
            self._colours.append("")
        for i, (swatch, text) in enumerate(self._rows):
            if i >= len(items):
                swatch.hide()
                text.hide()
                continue
            name, nbytes, shade = items[i]
            if self._colours[i] != colour(shade):  # a new colour, or the theme's changed
                self._colours[i] = colour(shade)
                swatch.setStyleSheet(f"background: {colour(shade)}; border-radius: 2px;")
            text.setText(f"{name}  <b>{fmt_bytes(nbytes)}</b>")
            swatch.show()
            text.show()

    def items(self) -> list[str]:
        """The texts of the rows on show (tests read these)."""
        return [t.text() for _s, t in self._rows if not t.isHidden()]

    def labels(self) -> list[QLabel]:
        return [t for _s, t in self._rows if not t.isHidden()]
