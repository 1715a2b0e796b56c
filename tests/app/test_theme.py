"""Light and dark appearance (app/theme.py): every colour of the style sheet has its dark
counterpart, text stays readable in both, and the setting switches the whole window,
including what widgets paint themselves."""

from __future__ import annotations

import re
from pathlib import Path

from fake_engine import FakeEngine
from PySide6.QtWidgets import QApplication

from app import theme
from app.engine_bridge import LoadRequest
from app.paths import resource

SURFACES = ("#ffffff", "#f6f7f9", "#eceff3")  # chat and cards, the window, the sidebar
TEXT = {"#1f2430": 7.0, "#2b3240": 7.0, "#4a5363": 4.5, "#6b7585": 3.0, "#1d2b6b": 4.5}


def luminance(hex_colour: str) -> float:
    def channel(c: int) -> float:
        c = c / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    """WCAG 2's contrast ratio of two colours."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_every_colour_of_the_sheet_has_a_dark_counterpart():
    light = resource("style.qss").read_text(encoding="utf-8")
    used = {c.lower() for c in theme.HEX.findall(light)}
    assert used and used <= set(theme.DARK), sorted(used - set(theme.DARK))
    dark = theme.style_sheet(dark=True)
    assert not {c.lower() for c in theme.HEX.findall(dark)} & used  # none left behind
    assert "$on_accent" not in dark and "@RES@" not in dark
    icons = re.findall(r"url\(([^)]+)\)", dark)
    assert icons and all(Path(i).is_file() and Path(i).parent == theme.dark_icons() for i in icons)
    chevron = (theme.dark_icons() / "chevron-up.svg").read_text(encoding="utf-8")
    assert theme.DARK["#4a5363"] in chevron  # drawn light on the dark controls
    assert theme.ON_ACCENT in (theme.dark_icons() / "check.svg").read_text(encoding="utf-8")


def test_text_is_readable_on_every_surface_in_both_themes():
    for text, least in TEXT.items():
        for surface in SURFACES:
            if text == "#1d2b6b" and surface != "#ffffff":
                continue  # accent text sits on the accent's tints and cards only
            assert contrast(text, surface) >= least, (text, surface)
            assert contrast(theme.DARK[text], theme.DARK[surface]) >= least, (text, surface)
    accent, tint = "#4f6bed", "#eef2fe"
    assert contrast(theme.ON_ACCENT, accent) >= 4.5  # the primary button's label
    assert contrast(theme.ON_ACCENT, theme.DARK[accent]) >= 3.0
    assert contrast(theme.DARK["#1d2b6b"], theme.DARK[tint]) >= 7.0  # a chip's name


def test_the_setting_switches_the_window_and_what_it_paints(qtbot, make_window, monkeypatch):
    window = make_window(loader=FakeEngine.loader(script=["```py\n", "x = 1\n", "```\n"]))
    app, settings = QApplication.instance(), window.ctx.settings
    assert settings.get("app/theme") == "system" and not theme.THEME.dark  # offscreen: light
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", settings.engine_settings(), 4096))
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("Code?")

    def code_shade() -> str:
        doc = window.chat.message_widgets()[-1].answer_view.document()
        block = doc.begin()
        while block.isValid() and not block.text().startswith("x = 1"):
            block = block.next()
        return block.blockFormat().background().color().name()

    assert code_shade() == "#f3f5f8"
    combo = window.settings.editors["app/theme"]
    combo.setCurrentIndex(theme.THEMES.index("dark"))  # as the settings panel's list does
    assert settings.get("app/theme") == "dark" and theme.THEME.dark
    assert "#17191e" in app.styleSheet() and "#f6f7f9" not in app.styleSheet()
    assert window.gauge.plot.backgroundBrush().color().name() == theme.DARK["#ffffff"]
    assert code_shade() == theme.DARK["#f3f5f8"]
    assert not window.chat.message_widgets()[0].edit_button.isHidden()  # redrawn as it was
    settings.set("app/theme", "light")
    assert not theme.THEME.dark and "#f6f7f9" in app.styleSheet()
    assert window.gauge.plot.backgroundBrush().color().name() == "#ffffff"
    monkeypatch.setattr(theme, "system_is_dark", lambda: True)
    settings.set("app/theme", "system")  # the desktop's scheme, dark here
    assert theme.THEME.dark
    monkeypatch.setattr(theme, "system_is_dark", lambda: False)
    theme._system_changed()  # the desktop went light: the window follows
    assert not theme.THEME.dark and "#f6f7f9" in app.styleSheet()


def test_the_chat_text_size_follows_its_setting_and_the_keys(qtbot, make_window):
    """Settings > App > "Chat text size" sizes the messages and the message box; Ctrl+plus
    and Ctrl+minus step it within its bounds, Ctrl+0 brings back the default."""
    from PySide6.QtCore import Qt

    window = make_window()
    window.show()
    window.close_welcome()
    panel, settings = window.chat, window.ctx.settings
    assert panel.input.font().pointSize() == 10
    settings.set("app/chat_text_size", 14)
    assert panel.input.font().pointSize() == 14
    assert window.settings.editors["app/chat_text_size"].value() == 14
    window.activateWindow()
    panel.input.setFocus()
    qtbot.waitUntil(lambda: panel.input.hasFocus(), timeout=1000)
    ctrl = Qt.KeyboardModifier.ControlModifier
    qtbot.keyClick(panel.input, Qt.Key.Key_Equal, ctrl)
    assert settings.get("app/chat_text_size") == 15 and panel.input.font().pointSize() == 15
    qtbot.keyClick(panel.input, Qt.Key.Key_Minus, ctrl)
    qtbot.keyClick(panel.input, Qt.Key.Key_Minus, ctrl)
    assert settings.get("app/chat_text_size") == 13
    qtbot.keyClick(panel.input, Qt.Key.Key_0, ctrl)
    assert settings.get("app/chat_text_size") == 10
    settings.set("app/chat_text_size", 32)
    window.text_size(1)
    assert settings.get("app/chat_text_size") == 32  # the bound holds
