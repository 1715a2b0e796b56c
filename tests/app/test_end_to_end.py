"""The app over the real engine: a tiny random checkpoint on the numpy backend."""

from __future__ import annotations

import pytest

from app import planning
from app.models.catalog import Entry
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
    s.set("engine/backend", "cpu")
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
