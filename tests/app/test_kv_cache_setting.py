"""The KV cache setting from the app's side: stored, handed to the engine's settings, chosen in
the settings panel, and the fit previews planned again when it changes."""

from __future__ import annotations

import pytest

from app.state.settings import SettingError


def test_the_setting_reaches_the_engine_settings(app_settings, monkeypatch):
    monkeypatch.setenv("SNUG_KV_CACHE", "int8")  # the app's setting owns it, as the backend
    assert app_settings.kv_cache == "bf16" and app_settings.engine_settings().kv_cache == "bf16"
    app_settings.set("engine/kv_cache", "int8")
    assert app_settings.engine_settings().kv_cache == "int8"
    assert app_settings.needs_reload("engine/kv_cache")
    with pytest.raises(SettingError, match="engine/kv_cache.*not one of bf16, int8"):
        app_settings.set("engine/kv_cache", "fp8")


def test_the_panel_chooses_it_and_the_previews_follow(qtbot, make_window):
    window = make_window()
    combo = window.settings.editors["engine/kv_cache"]
    assert [combo.itemData(i) for i in range(combo.count())] == ["bf16", "int8"]
    advisor, s = window.ctx.advisor, window.ctx.settings
    assert advisor._settings_key()[0].kv_cache == "bf16"
    with qtbot.waitSignal(advisor.changed, timeout=2000):
        combo.setCurrentIndex(combo.findData("int8"))
    assert s.kv_cache == "int8" and advisor._settings_key()[0].kv_cache == "int8"
    s.set("engine/kv_cache", "bf16")  # from elsewhere (Restore defaults): the panel follows
    assert combo.currentData() == "bf16"
    assert window.settings.editors["engine/backend"].currentData() == s.backend
