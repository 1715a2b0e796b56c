"""The first-run view in a small window (1024x640, the middle column then about 460 px
wide): the recommendation, why, and the three buttons are shown whole, wrapped onto more
lines where the width is short, never cut off."""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QPoint
from PySide6.QtWidgets import QLabel, QWidget

from tests.app.conftest import FakeGpu


def _whole(label: QLabel) -> bool:
    """Whether the label has the room its text needs (its lines at its width)."""
    if label.wordWrap():
        return label.height() >= label.heightForWidth(label.width())
    return label.width() >= label.sizeHint().width()


def _inside(widget: QWidget, outer: QWidget) -> bool:
    top_left = widget.mapTo(outer, QPoint(0, 0))
    return top_left.x() >= 0 and top_left.x() + widget.width() <= outer.width()


def test_the_welcome_card_fits_a_small_window(qtbot, make_window):
    window = make_window(gpu_source=FakeGpu)
    window.resize(1024, 640)
    welcome = window.welcome
    assert window.center.currentWidget() is welcome
    qtbot.waitUntil(lambda: welcome.go_button.isEnabled(), timeout=10000)
    QCoreApplication.processEvents()
    card = welcome.findChild(QWidget, "welcomeCard")
    assert welcome.width() < 520  # the small window's middle column
    for label in (welcome.machine_label, welcome.model_label, welcome.why):
        assert _whole(label), label.objectName()
        assert _inside(label, card if label is not welcome.machine_label else welcome)
    for button in (welcome.go_button, welcome.other_button, welcome.later_button):
        assert button.width() >= button.sizeHint().width(), button.text()
        assert _inside(button, card), button.text()
    assert _inside(card, welcome)
