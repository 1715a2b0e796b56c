"""Helpers for the GUI tests: model folders on disk, waiting for verdicts, modal dialogs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from app.paths import resource


def model_folder(path: Path, shape: str = "0.8B") -> Path:
    """A folder that passes the library's check: the catalog's config of `shape` and a
    (placeholder) safetensors file. Planning it fails (the file has no tensors); loading it
    works with the fake engine."""
    path.mkdir(parents=True, exist_ok=True)
    config = json.loads(resource("catalog.json").read_text())["shapes"][shape]
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"\0" * 16)
    return path


def answer_next_dialog(click: str, seen: list[str], timeout_ms: int = 3000) -> None:
    """When the next modal message box opens, record its texts in `seen` and click the
    button whose text is `click` (as a user would)."""
    waited = [0]

    def poll() -> None:
        box = QApplication.activeModalWidget()
        if isinstance(box, QMessageBox):
            seen.extend([box.windowTitle(), box.text(), box.informativeText()])
            seen.extend(b.text() for b in box.buttons())
            button = next(b for b in box.buttons() if b.text().replace("&", "") == click)
            button.click()
            return
        waited[0] += 20
        if waited[0] < timeout_ms:
            QTimer.singleShot(20, poll)

    QTimer.singleShot(20, poll)


def badge_texts(panel) -> dict[str, str]:
    """Library panel: entry key -> badge text."""
    out = {}
    for entry in panel.library.entries():
        card = panel.card(entry.key)
        if card is not None:
            out[entry.key] = card.badge.text()
    return out


def settled(panel) -> Callable[[], bool]:
    """A waitUntil condition: no library badge says Checking… any more."""
    return lambda: all(not t.startswith("Checking") for t in badge_texts(panel).values())
