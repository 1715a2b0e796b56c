"""Start the GUI: QApplication, icon, style sheet, one main window."""

from __future__ import annotations

import logging
import sys
import time

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMainWindow, QMessageBox

from app import desktop_entry, theme
from app.context import build_context
from app.main_window import MainWindow
from app.paths import resource

log = logging.getLogger(__name__)


def make_app(argv: list[str] | None = None) -> QApplication:
    app = QApplication.instance() or QApplication(argv if argv is not None else sys.argv)
    app.setOrganizationName("Snug")
    app.setApplicationName("Snug")
    app.setApplicationDisplayName("Snug")
    app.setDesktopFileName("snug")
    icon = resource("snug.png")
    if icon.exists():
        app.setWindowIcon(QIcon(str(icon)))
    theme.apply("light")  # the window applies the setting's (app/theme.py)
    return app


def _option(args: list[str], name: str) -> str | None:
    """The value after `name` in args (`--smoke DIR`), or None."""
    if name in args:
        i = args.index(name)
        if i + 1 < len(args):
            return args[i + 1]
    return None


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = list(sys.argv if argv is None else argv)
    app = make_app(args)
    smoke = _option(args, "--smoke")
    if smoke is not None:
        from app import smoke as smoke_run

        return smoke_run.run(smoke, _option(args, "--screenshot"), started)
    try:
        if "--demo" in args:
            from app.demo import demo_context

            ctx = demo_context()
        else:
            ctx = build_context()
    except Exception as exc:  # build_context has shut down what it started; say why, stop
        log.exception("Snug could not start")
        QMessageBox.critical(None, "Snug could not start", f"{type(exc).__name__}: {exc}")
        return 1
    window = MainWindow(ctx)
    window.resize(1280, 800)
    window.show()
    show_problems(window, ctx.problems)
    # A bundle asks once whether to add itself to the applications menu.
    QTimer.singleShot(500, lambda: desktop_entry.offer(window, ctx.settings.store))
    return app.exec()


def show_problems(window: QMainWindow, problems: list[str]) -> None:
    """Start-up warnings (settings, SNUG_* variables, chat files skipped) on the status bar;
    the first is shown, all of them in its tooltip (and each was logged)."""
    if not problems:
        return
    more = f" (+{len(problems) - 1} more: hover here)" if len(problems) > 1 else ""
    window.statusBar().showMessage(problems[0] + more, 60000)
    window.statusBar().setToolTip("\n".join(problems))


if __name__ == "__main__":
    sys.exit(main())
