"""Snug's PySide6 desktop app. The engine runs on one worker thread; see app/workers."""
