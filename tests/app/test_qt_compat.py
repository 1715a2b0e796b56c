"""The PySide6 6.12 emit() reference bug must not be able to free True."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal

import app  # noqa: F401  (applies the workaround on import)
from app import qt_compat


class _Chatty(QObject):
    ping = Signal(object)


def test_many_emits_leave_true_alive(qtbot):
    chatty = _Chatty()
    chatty.ping.connect(lambda _v: None)
    for _ in range(20000):
        chatty.ping.emit(None)
    if qt_compat.emit_drops_a_reference() and sys.version_info < (3, 12):
        assert getattr(qt_compat.patch, "done", False)
        assert sys.getrefcount(True) > qt_compat.RESERVE // 2
    assert True is not False
