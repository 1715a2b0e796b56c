"""The prompt cache from the app's side: budgets in the settings, the disk tier in the app's
data folder, and a saved chat opened after a restart resumes from disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QCoreApplication, QStandardPaths

from engine.config import GIB, EngineSettings, default_data_dir, default_prompt_cache_dir


def test_the_defaults_and_zero_turning_a_tier_off(app_settings, monkeypatch, tmp_path):
    monkeypatch.setenv("SNUG_PROMPT_CACHE_DIR", str(tmp_path))
    es = app_settings.engine_settings()
    assert (es.prompt_cache_host_bytes, es.prompt_cache_disk_bytes) == (2 * GIB, 8 * GIB)
    assert es.prompt_cache_dir == str(tmp_path)
    app_settings.set("cache/disk_gib", 0)
    app_settings.set("cache/host_gib", 0.5)
    es = app_settings.engine_settings()
    assert (es.prompt_cache_host_bytes, es.prompt_cache_disk_bytes) == (GIB // 2, 0)
    assert app_settings.needs_reload("cache/disk_gib")


def test_the_disk_tier_lives_in_the_apps_data_folder(app_settings, monkeypatch, qtbot):
    monkeypatch.delenv("SNUG_PROMPT_CACHE_DIR", raising=False)
    folder = Path(app_settings.engine_settings().prompt_cache_dir)
    assert folder == default_prompt_cache_dir() == default_data_dir() / "prompt-cache"
    app = QCoreApplication.instance()
    names = app.organizationName(), app.applicationName()
    app.setOrganizationName("Snug")  # as app.main.make_app names the app
    app.setApplicationName("Snug")
    try:
        where = QStandardPaths.StandardLocation.AppDataLocation
        assert Path(QStandardPaths.writableLocation(where)) == default_data_dir()
    finally:
        app.setOrganizationName(names[0])
        app.setApplicationName(names[1])


@pytest.fixture
def tiny(tiny_checkpoint):
    try:
        return tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")
    except ImportError as exc:  # the builder needs transformers
        pytest.skip(f"cannot build a tiny checkpoint here: {exc}")


def test_a_saved_chat_opened_after_a_restart_resumes_from_disk(
    app_settings, monkeypatch, tmp_path, tiny
):
    """The app sends the whole history as the prompt: the engine it loads (through the
    bridge, with the app's settings) restores the conversation from the data folder."""
    from app.engine_bridge import LoadRequest, load_engine, make_params

    monkeypatch.setenv("SNUG_PROMPT_CACHE_DIR", str(tmp_path))
    app_settings.set("engine/backend", "numpy")
    request = LoadRequest(str(tiny), app_settings.engine_settings(), context=512, max_rows=64)
    params = make_params({"max_new_tokens": 8, "greedy": True})
    chat = [{"role": "user", "content": "What is a snug?"}]
    engine = load_engine(request)
    reply = "".join(e.text for e in engine.generate(engine.chat_ids(chat), params))
    engine.unload()
    assert list(tmp_path.glob("*.safetensors"))
    chat += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]
    engine = load_engine(request)  # the app started again, the chat opened
    ids = engine.chat_ids(chat)
    got = [e.token_id for e in engine.generate(ids, params)]
    assert engine.prompt_cache.stats.hits["disk"] == 1
    engine.unload()
    fresh = load_engine(LoadRequest(str(tiny), EngineSettings(backend="numpy"), 512, max_rows=64))
    assert got == [e.token_id for e in fresh.generate(ids, params)]
    fresh.unload()
