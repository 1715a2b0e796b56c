"""Snug desktop app: PySide6 front end over the engine package."""

from app.qt_compat import patch as _patch_pyside_refcount

_patch_pyside_refcount()
