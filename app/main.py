"""Start the GUI: QApplication, icon, style sheet, one main window."""

from __future__ import annotations

import sys

from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.context import build_context
from app.main_window import MainWindow
from app.paths import resource


def make_app(argv: list[str] | None = None) -> QApplication:
    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv)
    app.setOrganizationName("Snug")
    app.setApplicationName("Snug")
    app.setApplicationDisplayName("Snug")
    app.setDesktopFileName("snug")
    icon = resource("snug.png")
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))
    style = resource("style.qss")
    if style.exists():
        qss = style.read_text(encoding="utf-8")
        app.setStyleSheet(qss.replace("@RES@", resource("").as_posix().rstrip("/")))
    return app


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv if argv is None else argv)
    app = make_app(args)
    if "--demo" in args:
        from app.demo import demo_context

        ctx = demo_context()
    else:
        ctx = build_context()
    window = MainWindow(ctx)
    window.resize(1280, 800)
    window.show()
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
