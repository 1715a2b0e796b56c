"""Snug desktop app: PySide6 front end over the engine package."""
