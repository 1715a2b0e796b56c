"""Work around a reference-count bug of PySide6 6.12 on Python 3.11.

In PySide6 6.12.0, every `SignalInstance.emit()` called from Python returns `True` without
taking a reference to it, so each emit drops one reference that `True` never got. On Python
3.12+ `True` is immortal and nothing happens; on 3.11 its count drains with every emit (ours
and pyqtgraph's) until the interpreter aborts with "bool_dealloc: deallocating True or
False". `patch()` detects the bug and, only then, gives `True` and `False` a reserve of
references so large that they can never reach zero, which is what Python 3.12 does.
"""

from __future__ import annotations

import ctypes
import sys

RESERVE = 1 << 48


def emit_drops_a_reference() -> bool:
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        ping = Signal()

    probe = _Probe()
    before = sys.getrefcount(True)
    for _ in range(16):
        probe.ping.emit()
    return before - sys.getrefcount(True) >= 16


def patch() -> bool:
    """Apply the workaround where needed; returns True when it was applied."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    if getattr(patch, "done", False):
        return True
    if not emit_drops_a_reference():
        return False
    for obj in (True, False):
        # ob_refcnt is the first field of every object in CPython 3.11 (Py_ssize_t).
        ctypes.c_ssize_t.from_address(id(obj)).value += RESERVE
    patch.done = True
    return True
