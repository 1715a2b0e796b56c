"""Max rows the settings allow past the load panel's old 8,192 (up to 65,536): the panel
plans, shows and loads what the Models tab plans, not a value its control clamped."""

from __future__ import annotations

from test_panels import fake_planner

from app.state.catalog import Entry
from tests.app.conftest import FakeGpu


def test_the_load_panel_plans_the_max_rows_the_settings_hold(qtbot, make_window):
    calls: list = []
    window = make_window(gpu_source=FakeGpu, planner=fake_planner(calls))
    qtbot.waitUntil(lambda: window.ctx.machine.gpu is not None, timeout=3000)
    window.ctx.settings.set("engine/max_rows", 16384)
    entry = Entry("folder:/m", "my-model", "", 1 << 30, "folder", local_dir="/m")
    window.choose(entry)
    panel = window.load
    qtbot.waitUntil(lambda: panel.badge.text() == "Fits", timeout=3000)
    assert panel.rows_spin.value() == 16384
    asked = {c["max_rows"] for c in calls if c.get("model_dir") == "/m"}
    assert asked == {16384}
    library = window.ctx.advisor.verdict(entry)  # the Models tab's verdict: the same plan
    assert library is panel.decision
