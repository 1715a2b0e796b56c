"""Where the app finds its resources (icons, style sheet, desktop entry, catalog)."""

from __future__ import annotations

from pathlib import Path

RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def resource(name: str) -> Path:
    return RESOURCES / name
