"""Window-level behaviour: settings, the VRAM gauge, CPU mode, shutdown, the library."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine
from PySide6.QtCore import QSettings

from app.engine_bridge import LoadRequest
from app.state.settings import AppSettings
from tests.app.conftest import FakeGpu
from tests.app.helpers import model_folder, settled


def test_settings_persist_across_a_restart(qtbot, make_window, tmp_path):
    path = str(tmp_path / "persist.ini")
    window = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    editors = window.settings.editors
    editors["memory/reserve_gib"].setValue(1.25)
    editors["engine/context"].setValue(16384)
    editors["sampling/temperature"].setValue(0.3)
    editors["chat/thinking"].setChecked(True)
    editors["engine/backend"].setCurrentIndex(editors["engine/backend"].findData("numpy"))
    editors["chat/system_prompt"].setPlainText("Be brief.")
    window.close()

    again = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    s = again.ctx.settings
    assert s.get("memory/reserve_gib") == 1.25
    assert s.context == 16384 and again.load.context_spin.value() == 16384
    assert s.get("sampling/temperature") == 0.3
    assert s.thinking is True and s.backend == "numpy"
    assert again.settings.editors["engine/backend"].currentText() == "CPU (numpy)"
    assert s.system_prompt == "Be brief."
    assert again.settings.editors["memory/reserve_gib"].value() == 1.25
    assert s.engine_settings().backend == "numpy"


def test_an_old_settings_file_with_backend_cpu_reads_as_numpy(qtbot, make_window, tmp_path):
    path = str(tmp_path / "old.ini")
    old = QSettings(path, QSettings.Format.IniFormat)
    old.setValue("engine/backend", "cpu")  # the value settings files held before "numpy"
    old.sync()
    window = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    s = window.ctx.settings
    assert s.backend == "numpy" and s.engine_settings().backend == "numpy"
    assert window.settings.editors["engine/backend"].currentData() == "numpy"


def test_load_request_refuses_sizes_below_one(app_settings):
    with pytest.raises(ValueError, match="context = 0"):
        LoadRequest("/m", app_settings.engine_settings(), context=0)


def test_defaults(settings_store):
    s = AppSettings(settings_store)
    assert s.context == 8192 and s.max_rows == 0 and s.streams == 1  # 0: the plan chooses
    assert s.get("memory/reserve_gib") == 0.5 and s.engine_settings().limit_bytes is None
    sampling = s.sampling()
    assert (sampling["temperature"], sampling["top_p"], sampling["top_k"]) == (0.7, 0.8, 20)
    assert (sampling["presence_penalty"], sampling["min_p"]) == (1.5, 0.0)


def test_reload_notice_when_a_setting_needs_it(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.settings.editors["sampling/top_k"].setValue(40)
    assert window.settings.reload_note.isHidden()
    window.settings.editors["memory/reserve_gib"].setValue(1.0)
    assert "memory reserve" in window.settings.reload_note.text()


def test_gauge_without_nvml_says_cpu_mode(qtbot, make_window):
    window = make_window()
    qtbot.waitUntil(lambda: bool(window.ctx.machine.no_gpu), timeout=3000)
    text = window.gauge.state_text()
    assert "No NVIDIA GPU found — running on the CPU (numpy backend)" in text
    assert window.gauge.plot.isHidden()
    assert "CPU mode" in window.model_status.text()


def test_gauge_with_a_gpu_shows_usage_and_history(qtbot, make_window):
    window = make_window(gpu_source=FakeGpu)
    qtbot.waitUntil(lambda: len(window.ctx.machine.history) >= 2, timeout=3000)
    assert "Test GPU" in window.gauge.state_text()
    names = [name for name, _b, _c in window.gauge.bar.segments()]
    assert names == ["Snug", "Other programs", "Free"]
    assert window.gauge.used_curve.getData()[0] is not None


def test_refuse_cpu_mode_explains_the_setting(qtbot, make_window, tmp_path):
    window = make_window(loader=FakeEngine.loader())
    qtbot.waitUntil(lambda: bool(window.ctx.machine.no_gpu), timeout=3000)
    window.ctx.settings.set("engine/refuse_cpu", True)
    entry = window.ctx.library.add_folder(str(model_folder(tmp_path / "model")))
    window.choose(entry)
    with qtbot.waitSignal(window.ctx.engine.load_failed, timeout=3000) as failed:
        window.load.load_button.click()
    assert failed.args[0] == "CpuModeRefused"
    assert "Refuse CPU mode" in window.load.error.text()
    assert window.ctx.engine.state == "empty"


def test_cpu_mode_load_is_labelled(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(
            LoadRequest("/models/tiny", window.ctx.settings.engine_settings(), 4096)
        )
    assert "CPU mode" in window.model_status.text()


def test_closing_the_window_stops_the_worker_thread(qtbot, make_window):
    loader = FakeEngine.loader(script=["x"] * 1000, delay=0.01)
    window = make_window(loader=loader)
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.ctx.chats.send("long")
    qtbot.waitUntil(lambda: window.ctx.chats.busy, timeout=1000)
    thread = window.ctx.engine.thread
    window.close()
    assert not thread.isRunning()
    assert loader.made[0].loaded is False, "closing unloads the model"


def test_library_shows_fit_verdicts_for_this_gpu(qtbot, make_window):
    window = make_window(gpu_source=FakeGpu)
    qtbot.waitUntil(lambda: window.ctx.machine.gpu is not None, timeout=3000)
    panel = window.library
    qtbot.waitUntil(settled(panel), timeout=5000)  # verdicts are planned off the UI thread
    labels = {
        key: card.badge.text()
        for key in ("qwen3.5-0.8b-4bit", "qwen3.5-9b-bf16")
        if (card := panel.card(key)) is not None
    }
    assert labels["qwen3.5-0.8b-4bit"].startswith("Fits"), panel.card("qwen3.5-0.8b-4bit").toolTip()
    assert labels["qwen3.5-9b-bf16"] == "Does not fit"
    assert panel.card("qwen3.5-9b-bf16").reason.text()


def test_status_bar_names_the_model_not_its_folder(qtbot, make_window, tmp_path):
    """A download's folder is the cache's revision hash, a remote target's key ends with the
    server's address: the status bar names the model."""
    from app.remote_engine import RemoteTarget

    window = make_window(loader=FakeEngine.loader())
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--mlx-community--Qwen3.5-4B-MLX-4bit" / "snapshots"
    for where, expected in (
        (str(snapshot / revision), "Qwen3.5-4B-MLX-4bit"),
        ("/models/my-tiny-qwen", "my-tiny-qwen"),
        (RemoteTarget(url="http://user:pw@host:8080/v1", model="qwen3.5:4b").key, "qwen3.5:4b"),
    ):
        with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
            window.ctx.engine.load(LoadRequest(where, window.ctx.settings.engine_settings(), 4096))
        text = window.model_status.text()
        assert text.startswith(expected + " · "), text
        assert revision not in text and "pw" not in text and "8080" not in text


def test_status_bar_uses_the_library_title_of_a_folder_it_lists(qtbot, make_window, tmp_path):
    window = make_window(loader=FakeEngine.loader())
    entry = window.ctx.library.add_folder(str(model_folder(tmp_path / "model")))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(
            LoadRequest(entry.local_dir, window.ctx.settings.engine_settings(), 4096)
        )
    assert window.model_status.text().startswith(entry.title + " · ")


def test_a_long_status_line_wraps_in_a_small_window(qtbot, make_window):
    """At the smallest window a long line under the chat takes more lines: it is neither
    clipped nor pushes the sidebar and the right column aside."""
    from PySide6.QtCore import QRect, Qt

    window = make_window()
    window.close_welcome()
    window.resize(window.minimumSize())
    qtbot.wait(50)
    sizes = window.splitter.sizes()
    status = window.chat.status
    text = (
        "Not attached: photo.png is a PNG image, not text: the model reads text only. Attach "
        "a text file (notes, source code, Markdown, CSV), a PDF with a text layer or a Word "
        "document (.docx)"
    )
    window.ctx.chats.notice.emit(text)
    qtbot.wait(50)
    assert window.splitter.sizes() == sizes
    assert status.width() <= window.chat.width() <= sizes[1]
    wrap = Qt.TextFlag.TextWordWrap
    needs = status.fontMetrics().boundingRect(QRect(0, 0, status.width(), 10000), wrap, text)
    assert needs.width() <= status.width() and needs.height() <= status.height()


def test_tab_leaves_the_message_box(qtbot, make_window):
    from PySide6.QtCore import Qt

    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    composer = window.chat.input
    window.activateWindow()
    composer.setFocus()
    qtbot.waitUntil(composer.hasFocus, timeout=1000)
    composer.setPlainText("Hello")
    qtbot.keyClick(composer, Qt.Key.Key_Tab)
    assert composer.toPlainText() == "Hello" and not composer.hasFocus()
    assert window.focusWidget() is window.chat.send_button  # the keyboard goes on to Send


def test_the_columns_keep_their_widths_after_a_restart(qtbot, make_window, tmp_path):
    path = str(tmp_path / "columns.ini")
    window = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    qtbot.wait(20)
    sizes = window.splitter.sizes()
    dragged = [sizes[0] + 90, sizes[1] - 90, sizes[2]]  # the sidebar made wider
    window.splitter.setSizes(dragged)
    dragged = window.splitter.sizes()
    window.close()
    again = make_window(store=QSettings(path, QSettings.Format.IniFormat))
    qtbot.wait(20)
    assert again.splitter.sizes() == dragged


def test_tab_goes_through_the_messages_in_their_place(qtbot, make_window):
    """From the chat's header Tab passes the messages, top to bottom, then reaches the
    message box's row; not the right column's widgets first."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.ctx.chats.send("Hello")
    question, reply = window.chat.message_widgets()
    qtbot.waitUntil(reply.isVisible, timeout=1000)  # drawn on the next turn of the loop
    window.activateWindow()
    window.chat.system_button.setFocus()
    qtbot.waitUntil(window.chat.system_button.hasFocus, timeout=1000)
    visited = []
    while len(visited) < 30 and QApplication.focusWidget() is not window.chat.attach_button:
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        visited.append(QApplication.focusWidget())
    assert visited[-1] is window.chat.attach_button
    stops = [w for w in visited if w in (question.edit_button, question.copy_button)]
    assert stops == [question.edit_button, question.copy_button]
    assert reply.copy_button in visited[visited.index(question.copy_button) :]
    assert window.library.open_button not in visited


def test_a_message_being_typed_stays_with_its_chat(qtbot, make_window, settings_store):
    """Text typed and not sent stays in the chat it was typed in: another chat shows its
    own (none), the first has it again, and so after a restart; a send clears it."""
    window = make_window(loader=FakeEngine.loader())
    first = window.ctx.chats.current.id
    window.chat.input.setPlainText("Half a thought")
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    window.ctx.chats.store.create()
    second = window.ctx.chats.store.chats()[0].id
    window.ctx.chats.select(second)
    assert window.chat.input.toPlainText() == ""
    window.chat.input.setPlainText("Another")
    window.ctx.chats.select(first)
    assert window.chat.input.toPlainText() == "Half a thought"
    window.close()
    again = make_window(loader=FakeEngine.loader(), store=settings_store)
    again.ctx.chats.select(first)
    assert again.chat.input.toPlainText() == "Half a thought"
    again.ctx.chats.select(second)
    assert again.chat.input.toPlainText() == "Another"
    with qtbot.waitSignal(again.ctx.engine.loaded, timeout=3000):
        again.ctx.engine.load(LoadRequest("/m", again.ctx.settings.engine_settings(), 4096))
    with qtbot.waitSignal(again.ctx.engine.finished, timeout=3000):
        again.chat.send()
    assert again.ctx.chats.store.get(second).draft == ""
    assert again.ctx.chats.current.turns[0].content == "Another"


def test_the_memory_plot_is_no_tab_stop(qtbot, make_window):
    """Tab passes over the VRAM plot (it has nothing to do by keyboard)."""
    from PySide6.QtCore import Qt

    window = make_window()
    assert window.gauge.plot.focusPolicy() == Qt.FocusPolicy.NoFocus
