"""The bundle's offer to add itself to the applications menu (asked once, on first start).

A one-folder bundle (packaging/build.py) has no installer; on its first start it asks
whether to write ~/.local/share/applications/snug.desktop pointing at its own executable and
icon. The answer is kept in the settings store (ASKED_KEY), so the question comes once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox, QWidget

from app.paths import resource

ASKED_KEY = "desktop/asked"
PATH_KEY = "desktop/entry"
FILE_NAME = "snug.desktop"


def applications_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "applications"


def bundle_executable() -> Path | None:
    """The bundle's own executable when running frozen (PyInstaller), else None."""
    if getattr(sys, "frozen", False):
        return Path(sys.executable).resolve()
    return None


def entry_text(exe: Path, icon: Path) -> str:
    """resources/snug.desktop with Exec= and Icon= pointing into the bundle."""
    lines = []
    for line in resource(FILE_NAME).read_text(encoding="utf-8").splitlines():
        if line.startswith("Exec="):
            line = f'Exec="{exe}" %U'
        elif line.startswith("Icon="):
            line = f"Icon={icon}"
        elif line.startswith("TryExec="):
            continue
        lines.append(line)
    lines.append(f"TryExec={exe}")
    return "\n".join(lines) + "\n"


def install(exe: Path, icon: Path | None = None, apps_dir: Path | None = None) -> Path:
    """Write the desktop entry; returns its path."""
    folder = apps_dir or applications_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE_NAME
    path.write_text(entry_text(exe, icon or resource("snug.png")), encoding="utf-8")
    path.chmod(0o755)
    return path


def was_asked(store: QSettings) -> bool:
    return str(store.value(ASKED_KEY, "false")).lower() in ("1", "true")


def offer(
    parent: QWidget | None,
    store: QSettings,
    exe: Path | None = None,
    apps_dir: Path | None = None,
) -> Path | None:
    """Ask once whether to add Snug to the applications menu; write the entry on Yes.

    `exe` defaults to the bundle's executable; outside a bundle nothing is asked.
    """
    exe = exe or bundle_executable()
    if exe is None or was_asked(store):
        return None
    box = QMessageBox(parent)
    box.setObjectName("desktopOffer")
    box.setWindowTitle("Add Snug to the applications menu?")
    box.setText("Add Snug to your applications menu?")
    where = (apps_dir or applications_dir()) / FILE_NAME
    box.setInformativeText(
        f"Snug will write {where}, which starts {exe}. Snug asks this once; "
        "the file can be deleted at any time."
    )
    yes = box.addButton("Add to menu", QMessageBox.ButtonRole.AcceptRole)
    box.addButton("No, thanks", QMessageBox.ButtonRole.RejectRole)
    box.exec()
    store.setValue(ASKED_KEY, True)
    path = None
    if box.clickedButton() is yes:
        path = install(exe, apps_dir=apps_dir)
        store.setValue(PATH_KEY, str(path))
    store.sync()
    return path
