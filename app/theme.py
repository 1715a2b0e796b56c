"""Light and dark appearance: the style sheet's colours, and those widgets draw themselves.

The style sheet (resources/style.qss) is written in the light theme's colours; the dark
theme is the same sheet with each colour replaced by its counterpart in DARK, so the two
cannot drift apart in layout, and a colour added to the sheet without a dark counterpart
fails a test. Widgets that paint (the stacked bars, the gauge's plot, code blocks) ask
`colour()` for the light colour they mean and get the current theme's.

The setting "app/theme" chooses: "system" (the desktop's colour scheme, as Qt reports it,
followed while the app runs), "light" or "dark".
"""

from __future__ import annotations

import atexit
import functools
import re
import shutil
import tempfile
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette

from app.paths import resource

THEMES = ("system", "light", "dark")
ON_ACCENT = "#ffffff"  # text on the accent colour: white in both themes (`$on_accent`)
DARK = {
    # surfaces, from the window behind everything to raised cards and inputs
    "#f6f7f9": "#17191e",
    "#ffffff": "#1e2128",
    "#f7f9ff": "#1f2436",
    "#eceff3": "#202329",
    "#f0f3f7": "#272b33",
    "#e0e5ec": "#2a2e36",
    "#e4e9f0": "#2f333b",
    "#f3f5f8": "#262a31",  # code blocks
    "#eef1f4": "#2a2e36",  # a stacked bar's track
    # lines
    "#dde2e8": "#30343c",
    "#e3e7ed": "#2c3038",
    "#d3d9e1": "#3a3f48",
    "#c9d1d9": "#3a3f48",
    "#b7c0cc": "#4a505a",
    "#dfe5ea": "#3a3f48",  # "Free" in the memory bars
    # text, strongest first
    "#1f2430": "#e3e6eb",
    "#2b3240": "#d5d9e0",
    "#4a5363": "#aab1bd",
    "#6b7585": "#8f98a6",
    "#7a8494": "#858e9c",
    "#8a93a3": "#7d8695",
    "#a4acb8": "#5c6370",
    # the accent and its tints
    "#4f6bed": "#6b84f5",
    "#4460dc": "#5a74ea",
    "#8aa0f5": "#6b84f5",
    "#b7c3f5": "#34406e",
    "#1d2b6b": "#c5d0fa",
    "#eef2fe": "#232a40",
    "#e8eefe": "#232a40",
    "#dbe3fb": "#2c3866",
    "#c9d5fb": "#3a4780",
    # errors, warnings, good news
    "#b42318": "#f28b82",
    "#fdecec": "#3a1f1f",
    "#f3c4c4": "#6b2c2c",
    "#fde4e4": "#3a1f1f",
    "#8a5a00": "#e0b04a",
    "#fff6e0": "#332a14",
    "#f1dca6": "#5c4a1e",
    "#fff3d6": "#332a14",
    "#17663a": "#7fd4a0",
    "#e3f6ec": "#1b3326",
}
HEX = re.compile(r"#[0-9a-fA-F]{6}\b")


class Theme(QObject):
    """The theme on show; `changed` after it switches (widgets that paint redraw)."""

    changed = Signal(bool)  # dark

    def __init__(self) -> None:
        super().__init__()
        self.dark = False
        self.setting = "light"
        self.following = False  # follow_system() has connected


THEME = Theme()


def colour(light: str) -> str:
    """The current theme's counterpart of `light` (a colour of the light theme)."""
    return colour_dark(light) if THEME.dark else light


def system_is_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def style_sheet(dark: bool) -> str:
    """resources/style.qss in the theme's colours, its icons' folder filled in."""
    qss = resource("style.qss").read_text(encoding="utf-8")
    if dark:
        qss = qss.replace("@RES@/icons", dark_icons().as_posix())
    qss = qss.replace("@RES@", resource("").as_posix().rstrip("/"))
    qss = qss.replace("$on_accent", ON_ACCENT)
    return HEX.sub(lambda m: colour_dark(m.group(0)), qss) if dark else qss


@functools.cache
def dark_icons() -> Path:
    """The style sheet's icons drawn in the dark theme's colours, in a folder of this
    process's (their white is a mark on the accent colour, and stays)."""
    folder = Path(tempfile.mkdtemp(prefix="snug-icons-"))
    atexit.register(shutil.rmtree, folder, True)
    for icon in resource("icons").glob("*.svg"):
        svg = icon.read_text(encoding="utf-8")
        svg = HEX.sub(lambda m: _icon_colour(m.group(0)), svg)
        (folder / icon.name).write_text(svg, encoding="utf-8")
    return folder


def colour_dark(light: str) -> str:
    return DARK.get(light.lower(), light)


def _icon_colour(light: str) -> str:
    return light if light.lower() == ON_ACCENT else colour_dark(light)


def apply(setting: str) -> None:
    """Show the theme `setting` names ("system" follows the desktop) on the application."""
    app = QGuiApplication.instance()
    dark = system_is_dark() if setting == "system" else setting == "dark"
    THEME.setting = setting
    unchanged = dark == THEME.dark and app is not None and bool(app.styleSheet())
    THEME.dark = dark
    if app is None or unchanged:
        return
    if resource("style.qss").exists():
        app.setStyleSheet(style_sheet(dark))
    palette = app.palette()  # what the sheet does not reach: links in rich text, selections
    palette.setColor(QPalette.ColorRole.Link, QColor(colour("#4f6bed")))
    palette.setColor(QPalette.ColorRole.Highlight, QColor(colour("#dbe3fb")))
    palette.setColor(QPalette.ColorRole.HighlightedText, QColor(colour("#1d2b6b")))
    app.setPalette(palette)
    THEME.changed.emit(dark)


def follow_system() -> None:
    """Apply the desktop's scheme again when it changes, where the setting says "system"
    (connected once a process)."""
    if not THEME.following:
        QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _: _system_changed())
        THEME.following = True


def _system_changed() -> None:
    if THEME.setting == "system":
        apply("system")
