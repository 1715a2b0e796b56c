"""The model loaded when Snug last closed is loaded again at start; an Unload, a failed
load or the setting turned off means it is not."""

from __future__ import annotations

from fake_engine import FakeEngine
from helpers import model_folder

from app.main_window import LOADED_KEY


def _load_folder(qtbot, window, folder):
    entry = window.ctx.library.add_folder(str(folder))
    assert entry.title == "model · bf16"  # the quantization its config.json says
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.choose_and_load(entry)
    return entry


def test_the_last_model_loads_again_at_start(qtbot, make_window, tmp_path):
    folder = model_folder(tmp_path / "model")
    window = make_window(loader=FakeEngine.loader())
    _load_folder(qtbot, window, folder)
    assert window.ctx.settings.store.value(LOADED_KEY) == str(folder.resolve())
    window.close()

    loader = FakeEngine.loader()
    again = make_window(loader=loader)  # the same settings: the folder is listed again
    qtbot.waitUntil(lambda: again.ctx.engine.state == "ready", timeout=5000)
    assert [r.model_dir for r in loader.requests] == [str(folder.resolve())]
    assert "the model loaded last time" in again.statusBar().currentMessage()
    again.load.unload_button.click()  # unloaded by hand: not loaded at the next start
    qtbot.waitUntil(lambda: again.ctx.engine.state == "empty", timeout=3000)
    again.close()

    idle = FakeEngine.loader()
    third = make_window(loader=idle)
    qtbot.waitUntil(lambda: bool(third.ctx.machine.no_gpu), timeout=3000)
    qtbot.wait(100)
    assert idle.requests == [] and third.ctx.engine.state == "empty"


def test_the_setting_off_or_a_failed_load_keeps_it_unloaded(qtbot, make_window, tmp_path):
    folder = model_folder(tmp_path / "model")
    window = make_window(loader=FakeEngine.loader())
    _load_folder(qtbot, window, folder)
    window.ctx.settings.set("app/load_last_model", False)
    window.close()
    off = FakeEngine.loader()
    second = make_window(loader=off)
    qtbot.waitUntil(lambda: bool(second.ctx.machine.no_gpu), timeout=3000)
    qtbot.wait(100)
    assert off.requests == []
    second.ctx.settings.set("app/load_last_model", True)
    second.close()

    def failing(request, progress=None):
        raise MemoryError("out of memory")

    third = make_window(loader=failing)
    qtbot.waitUntil(lambda: third.ctx.settings.store.value(LOADED_KEY) is None, timeout=5000)
    assert third.ctx.engine.state == "empty"  # and the next start does not try again


def test_quitting_while_the_last_model_loads_keeps_it_for_the_next_start(
    qtbot, make_window, tmp_path
):
    """A first load compiles for a while: quitting during the start's load ends it at its
    next stage, and the model is still the one loaded at the next start."""

    folder = model_folder(tmp_path / "model")
    window = make_window(loader=FakeEngine.loader())
    _load_folder(qtbot, window, folder)
    window.close()

    stages: list[int] = []
    slow = FakeEngine.compiling_loader(stages)

    second = make_window(loader=slow)
    qtbot.waitUntil(lambda: len(stages) >= 2, timeout=5000)
    second.close()
    assert len(stages) < 50
    assert second.ctx.settings.store.value(LOADED_KEY) == str(folder.resolve())

    loader = FakeEngine.loader()
    third = make_window(loader=loader)
    qtbot.waitUntil(lambda: third.ctx.engine.state == "ready", timeout=5000)
    assert [r.model_dir for r in loader.requests] == [str(folder.resolve())]
