"""Number boxes for the Settings and Load panels: text typed outside the range becomes the
nearest bound, and a box left empty goes back to the value it had before the edit."""

from __future__ import annotations

from PySide6.QtWidgets import QAbstractSpinBox, QDoubleSpinBox, QSpinBox, QWidget


class _KeepsValueWhenCleared:
    """For a QSpinBox or QDoubleSpinBox. Qt's CorrectToNearestValue alone turns an empty box
    into its minimum ("Max new tokens" 16, which cuts every reply short), and
    CorrectToPreviousValue would undo "0" typed in top-p instead of making it the smallest
    allowed. So: nearest value for a number out of range, and `fixup` (what Qt asks when it
    cannot read the text) gives the value from before the edit for a box left empty."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
        self._before = self.value()
        # A value the user is not in the middle of typing (set from code, stepped with the
        # arrows or the wheel), or one left with Enter or by leaving the box, is the one a
        # later edit starts from. Typed digits are not: with keyboard tracking "3000" passes
        # through 300, and erasing it all goes back to what was there before, not to 300.
        self.valueChanged.connect(self._settled)
        self.editingFinished.connect(self._remember)

    def setValue(self, value: float) -> None:
        # Also with signals blocked, as the panels set a value that came from elsewhere.
        super().setValue(value)
        self._remember()

    def fixup(self, text: str) -> str:
        body = text.removeprefix(self.prefix()).removesuffix(self.suffix())
        if body.strip():
            return super().fixup(text)
        before = min(max(self._before, self.minimum()), self.maximum())
        # The number's own text, not the special value's ("Auto"), which Qt does not read.
        return self.prefix() + self.textFromValue(before) + self.suffix()

    def _settled(self, _value: object) -> None:
        if not self.lineEdit().isModified():
            self._remember()

    def _remember(self) -> None:
        self._before = self.value()


class IntBox(_KeepsValueWhenCleared, QSpinBox):
    """A QSpinBox that keeps its value when left empty."""


class DecimalBox(_KeepsValueWhenCleared, QDoubleSpinBox):
    """A QDoubleSpinBox that keeps its value when left empty."""
