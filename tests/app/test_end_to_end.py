"""The app over the real engine: a tiny random checkpoint on the numpy backend."""

from __future__ import annotations

import pytest

from app import planning
from app.state.catalog import Entry
from engine.config import EngineSettings


@pytest.fixture
def tiny(tiny_checkpoint):
    try:
        return tiny_checkpoint()
    except ImportError as exc:  # the builder needs transformers
        pytest.skip(f"cannot build a tiny checkpoint here: {exc}")


def test_plan_a_local_folder_with_the_real_planner(tiny):
    gpu = planning.Gpu("Test GPU", 4 << 30, 3 << 30)
    decision = planning.plan(
        gpu=gpu,
        settings=EngineSettings(),
        context=2048,
        streams=1,
        max_rows=128,
        model_dir=str(tiny),
    )
    assert planning.verdict_label(decision).startswith("Fits"), decision
    assert planning.breakdown_value(decision, "weights") > 0


def test_load_and_chat_with_the_real_engine(qtbot, make_window, tiny):
    window = make_window()  # no GPU here: the numpy backend, labelled CPU mode
    s = window.ctx.settings
    s.set("engine/backend", "numpy")
    s.set("sampling/max_new_tokens", 6)
    s.set("sampling/temperature", 0.0)
    window.choose(Entry("folder:tiny", "tiny", "", 0, "folder", local_dir=str(tiny)))
    s.set("engine/context", 256)
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=20000) as loaded:
        window.load.load_button.click()
    assert loaded.args[0]["backend"] == "numpy"
    assert "CPU mode" in window.model_status.text()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=20000) as done:
        assert window.ctx.chats.send("hello")
    assert done.args[1]["finish_reason"] in ("stop", "length")
    assert window.chat.message_widgets()[-1].property("role") == "assistant"


def test_environment_engine_settings_reach_the_engine_on_load(
    qtbot, make_window, tiny, monkeypatch
):
    """SNUG_COMPUTE_DTYPE and SNUG_OVERLAP_LAUNCHES pass through the app's own settings."""
    from engine.session import Engine

    monkeypatch.setenv("SNUG_COMPUTE_DTYPE", "float32")
    monkeypatch.setenv("SNUG_OVERLAP_LAUNCHES", "0")
    received: list[EngineSettings] = []
    real_load = Engine.load.__func__

    def spy(cls, model_dir, settings=None, *args, **kwargs):
        received.append(settings)
        return real_load(cls, model_dir, settings, *args, **kwargs)

    monkeypatch.setattr(Engine, "load", classmethod(spy))
    window = make_window()  # the real loader: app.engine_bridge.load_engine
    s = window.ctx.settings
    s.set("engine/backend", "numpy")
    s.set("memory/reserve_gib", 0.25)
    window.choose(Entry("folder:tiny", "tiny", "", 0, "folder", local_dir=str(tiny)))
    s.set("engine/context", 256)
    failures: list[tuple[str, str]] = []
    window.ctx.engine.load_failed.connect(lambda cls, msg: failures.append((cls, msg)))
    window.load.load_button.click()  # the Load panel builds the request, as a user's click does
    qtbot.waitUntil(lambda: window.ctx.engine.state != "loading", timeout=20000)
    assert not failures and window.ctx.engine.state == "ready", failures
    assert len(received) == 1
    got = received[0]
    assert (got.compute_dtype, got.overlap_launches) == ("float32", False)
    assert (got.backend, got.reserve_bytes) == ("numpy", 1 << 28)  # the app's own fields
