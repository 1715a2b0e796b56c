"""Values the settings hold and the Settings tab's boxes usually leave out (a context or a
number of streams set in the Load tab, values an older version saved) are shown as they
are, and a start never changes them."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from app.state.settings import AppSettings

HELD = {
    "engine/context": 128,  # the Load tab takes contexts from 1 token
    "engine/streams": 32,  # ... and up to 1024 streams
    "sampling/max_new_tokens": 8,
    "sampling/temperature": 3.0,
    "sampling/presence_penalty": -0.5,
}


def test_a_start_keeps_values_outside_the_boxes_ranges(qtbot, make_window, tmp_path):
    path = str(tmp_path / "older.ini")
    older = QSettings(path, QSettings.Format.IniFormat)
    for key, value in HELD.items():
        older.setValue(key, value)
    older.sync()
    store = QSettings(path, QSettings.Format.IniFormat)
    window = make_window(store=store)
    s, editors = window.ctx.settings, window.settings.editors
    for key, value in HELD.items():
        assert s.get(key) == value, key
        assert editors[key].value() == value, key
    assert window.load.context_spin.value() == 128 and window.load.streams_spin.value() == 32
    window.close()
    again = AppSettings(QSettings(path, QSettings.Format.IniFormat))  # the next start
    assert {key: again.get(key) for key in HELD} == HELD


def test_building_the_settings_tab_writes_no_setting(qtbot, make_window):
    window = make_window()
    from app.panels.settings import SettingsPanel

    written: list[tuple[str, object]] = []
    window.ctx.settings.changed.connect(lambda key, value: written.append((key, value)))
    SettingsPanel(window.ctx.settings, window.ctx.engine).deleteLater()
    assert written == []


def test_streams_set_in_the_load_tab_show_in_the_settings_tab(qtbot, make_window):
    window = make_window()
    window.load.streams_spin.setValue(24)
    assert window.ctx.settings.streams == 24
    assert window.settings.editors["engine/streams"].value() == 24
    window.settings.editors["engine/streams"].setValue(2)  # and back within the usual range
    assert window.ctx.settings.streams == 2 and window.load.streams_spin.value() == 2
