"""Library and load panels: live verdicts, downloads through the UI, delete, `snug` entry."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from hf_server import FakeHub

from app.state.catalog import Entry
from tests.app.conftest import FakeGpu

REPO = "mlx-community/Qwen3.5-0.8B-MLX-4bit"


@dataclass(frozen=True)
class FakeVerdict:
    value: str


@dataclass(frozen=True)
class FakeDecision:
    """Decision-like value with the attributes the panels read."""

    verdict: FakeVerdict
    breakdown: dict = field(default_factory=dict)
    streams: int = 1
    context: int = 8192
    eager: bool = True
    suggestions: tuple[str, ...] = ()
    reason: str = ""


def fake_planner(calls: list):
    """Fits up to 16k tokens x streams, does not fit beyond; records each call."""

    def plan(**kw):
        calls.append(kw)
        need = kw["context"] * kw["streams"]
        bd = {
            "weights": 2 << 30,
            "stream_state_each": kw["context"] * 40_000,
            "stream_state_total": kw["context"] * 40_000 * kw["streams"],
            "reserve": 512 << 20,
            "free_after": (1 << 30) if need <= 16384 else -(1 << 30),
            "card_total": 8 << 30,
        }
        if need <= 16384:
            return FakeDecision(FakeVerdict("fits"), bd, kw["streams"], kw["context"], True, (), "")
        return FakeDecision(
            FakeVerdict("does not fit"),
            bd,
            kw["streams"],
            kw["context"],
            False,
            ("use a context of 16,384 tokens or less",),
            "needs 1.00 GiB more than this card can give",
        )

    return plan


def test_load_panel_recomputes_the_verdict_live(qtbot, make_window):
    calls: list = []
    window = make_window(gpu_source=FakeGpu, planner=fake_planner(calls))
    qtbot.waitUntil(lambda: window.ctx.machine.gpu is not None, timeout=3000)
    folder = Entry("folder:/m", "my-model", "", 1 << 30, "folder", local_dir="/m")
    window.choose(folder)
    panel = window.load
    qtbot.waitUntil(lambda: panel.badge.text() == "Fits", timeout=3000)  # planned off-thread
    assert panel.load_button.isEnabled()
    names = [n for n, _b, _c in panel.bar.segments()]
    assert names[:2] == ["Weights", "Stream state"] and "Free" in names
    panel.streams_spin.setValue(4)  # 4 x 8192 > 16384
    qtbot.waitUntil(lambda: panel.badge.text() == "Does not fit", timeout=3000)
    assert "16,384" in panel.suggestions.text() and not panel.suggestions.isHidden()
    assert not panel.load_button.isEnabled()
    assert any(c["streams"] == 4 and c.get("model_dir") == "/m" for c in calls)
    assert window.ctx.settings.streams == 4  # the panel edits the same setting
    panel.context_slider.setValue(0)  # 512 tokens
    assert panel.context_spin.value() == 512
    qtbot.waitUntil(lambda: panel.badge.text() == "Fits", timeout=3000)


def test_download_from_the_library_panel(qtbot, make_window, hf_home):
    files = {
        "config.json": b'{"model_type": "qwen3_5"}',
        "model.safetensors": os.urandom(2 << 20),
    }
    with FakeHub({REPO: files}, cut_once={"model.safetensors"}) as hub:
        window = make_window(gpu_source=FakeGpu)
        downloads = window.ctx.downloads
        downloads._worker.endpoint = hub.url
        panel = window.library
        panel.select("qwen3.5-0.8b-4bit")
        assert panel.download_button.isEnabled() and not panel.use_button.isEnabled()
        texts = []
        downloads.progress.connect(lambda *_a: texts.append(panel.progress_label.text()))
        with qtbot.waitSignal(downloads.finished, timeout=8000):
            panel.download_button.click()
        assert any(" of " in t and "/s" in t for t in texts), texts
        assert any(r for r in hub.ranges_for("model.safetensors")), "resumed with Range"
    entry = window.ctx.library.find("qwen3.5-0.8b-4bit")
    assert entry.downloaded
    panel.select(entry.key)
    assert panel.use_button.isEnabled() and panel.delete_button.isEnabled()
    assert "Downloaded" in panel.card(entry.key).meta.text()
    assert window.ctx.library.delete(entry) == ""
    assert not window.ctx.library.find("qwen3.5-0.8b-4bit").downloaded


def test_download_error_is_shown_in_the_panel(qtbot, make_window):
    window = make_window()
    window.ctx.downloads._worker.endpoint = "http://127.0.0.1:9"
    panel = window.library
    panel.select("qwen3.5-2b-4bit")
    with qtbot.waitSignal(window.ctx.downloads.failed, timeout=5000):
        panel.download_button.click()
    assert "Cannot reach the Hugging Face Hub" in panel.message.text()
    assert not panel.message.isHidden()


def test_entry_dispatches_subcommands_to_the_engine_cli(monkeypatch):
    import engine.cli
    from app import entry

    seen = []
    monkeypatch.setattr(engine.cli, "main", lambda argv: seen.append(argv) or 0)
    assert entry.main(["plan", "--shape", "4B"]) == 0
    assert seen == [["plan", "--shape", "4B"]]


class FastGpu(FakeGpu):
    """FakeGpu with the speed NVML reports for an RTX 4060 (the plan predicts from it)."""

    def read(self):
        from engine.memory.speed import REFERENCE_CARDS

        return super().read() | {"speed": REFERENCE_CARDS["RTX 4060 8GB"]}


def test_the_load_panel_says_how_fast_the_plan_will_be(qtbot, make_window):
    """The decision's prediction (engine/memory/speed.py), scaled to the card NVML
    describes, is shown with the verdict; a card of unknown speed shows none."""
    entry = Entry("cat:4b", "Qwen3.5 4B", "4-bit", 2 << 30, "catalog", shape="4B", fmt="mlx4")
    window = make_window(gpu_source=FastGpu)
    qtbot.waitUntil(lambda: window.ctx.machine.gpu is not None, timeout=3000)
    window.choose(entry)
    panel = window.load
    qtbot.waitUntil(lambda: "to the first token" in panel.detail.text(), timeout=5000)
    assert "tokens/s (predicted for an RTX 4060 (8 GB))" in panel.detail.text()
    other = make_window(gpu_source=FakeGpu)
    qtbot.waitUntil(lambda: other.ctx.machine.gpu is not None, timeout=3000)
    other.choose(entry)
    qtbot.waitUntil(lambda: other.load.badge.text() == "Fits", timeout=5000)
    assert "to the first token" not in other.load.detail.text()


def test_the_loaded_line_wraps_inside_the_panel(qtbot, make_window):
    """What the load panel says once a model is in (backend, memory held, why drafting is
    unavailable) is longer than the panel is wide: it wraps onto more lines, not cut off."""
    window = make_window(gpu_source=FakeGpu)
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)
    panel = window.load
    why = (
        "drafting is unavailable: the checkpoint has no mtp.* tensors: MLX conversions drop "
        "them (mlx-lm's sanitize), so drafting needs the Hugging Face checkpoint"
    )
    panel._loaded({"backend": "cuda", "held": 3 << 30, "drafting": why})
    label, lines = panel.stage, panel.stage.fontMetrics()
    assert why in label.text()
    assert lines.horizontalAdvance(label.text()) > label.width()  # longer than one line
    assert label.width() <= panel.width()
    assert label.heightForWidth(label.width()) >= 2 * lines.height()  # laid out on lines


def test_the_load_panels_line_speaks_of_the_model_on_show(qtbot, make_window):
    """The line under Load names what the model on show needs or has: a model not downloaded
    asks for its download, the loaded one says what its load gave, and going from the one to
    the other (or to a third) leaves no line of the model shown before."""
    from fake_engine import FakeEngine

    from app.engine_bridge import LoadRequest

    window = make_window(loader=FakeEngine.loader())
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))
    panel = window.load
    loaded = Entry("folder:/m", "my-model", "", 1 << 30, "folder", local_dir="/m")
    other = Entry("folder:/o", "other-model", "", 1 << 30, "folder", local_dir="/o")
    missing = window.ctx.library.find("qwen3.5-2b-4bit")
    assert missing is not None and not missing.downloaded

    window.choose(loaded)
    assert panel.stage.text().startswith("Loaded on") and panel.load_button.text() == "Reload"
    window.choose(missing)
    assert panel.stage.text().startswith("Download this model first")
    assert not panel.load_button.isEnabled()
    window.choose(loaded)
    assert panel.stage.text().startswith("Loaded on") and panel.load_button.text() == "Reload"
    window.choose(missing)
    window.choose(other)
    assert panel.stage.text() == "" and panel.load_button.text() == "Load"


def test_the_settings_fit_their_column_without_scrolling_sideways(qtbot, make_window):
    window = make_window()
    window.resize(window.minimumSize())
    window.tabs.setCurrentWidget(window.settings)
    qtbot.waitUntil(lambda: window.settings.viewport().width() < 420, timeout=2000)
    body = window.settings.widget()
    assert body.minimumSizeHint().width() <= window.settings.viewport().width()
    for editor in window.settings.editors.values():  # no field cut off at the right
        right = editor.mapTo(body, editor.rect().topRight()).x()
        assert right <= window.settings.viewport().width(), editor


def test_what_a_verdict_says_is_plain_english():
    """Every verdict's badge, reason and suggestions on small simulated cards, as the views
    show them: in GiB, without the planner's own words (scratch, rows, host memory, mlx4),
    and never "everything fits on the card" where part of it is kept in RAM."""
    from itertools import product

    from app import planning
    from engine.config import EngineSettings
    from engine.memory import Verdict
    from engine.memory.shapes import FORMATS, SHAPES, shape_config

    jargon = ("scratch", "-row", " rows", "host memory", "mlx4", " GB", "lazy", "embeddings")
    seen = set()
    for gib, name, fmt, (context, streams) in product(
        (2, 4, 5.5), SHAPES, FORMATS, ((8192, 1), (262144, 1), (65536, 4))
    ):
        gpu = planning.Gpu("Sim", int(gib * (1 << 30)), int(gib * (1 << 30)), capability=86)
        d = planning.plan(
            gpu=gpu,
            settings=EngineSettings(),
            context=context,
            streams=streams,
            max_rows=None,
            shape=(shape_config(name, fmt), fmt, 64),
        )
        seen.add(d.verdict)
        for text in (planning.verdict_label(d), d.reason, *d.suggestions):
            assert not any(word in text for word in jargon), text
        if "everything" in d.reason:
            assert d.verdict is Verdict.FITS and "RAM" not in d.reason, d.reason
        assert d.fits or d.suggestions, d.reason
    assert seen == set(Verdict)


def test_the_library_says_what_to_change_for_a_model_that_does_not_fit(qtbot, make_window):
    window = make_window(gpu_source=FakeGpu, planner=fake_planner([]))
    qtbot.waitUntil(lambda: window.ctx.machine.gpu is not None, timeout=3000)
    window.ctx.settings.set("engine/streams", 4)  # 4 x 8192 > 16384: does not fit

    def card():
        return window.library.card("qwen3.5-0.8b-4bit")

    qtbot.waitUntil(lambda: card().badge.text() == "Does not fit", timeout=5000)
    assert card().reason.text() == (
        "needs 1.00 GiB more than this card can give. "
        "To make it fit: use a context of 16,384 tokens or less."
    )
    assert not card().reason.isHidden()


def test_the_red_line_is_the_memory_limit_where_the_limit_is_lower(qtbot, make_window):
    def plan(**kw):
        bd = {
            "weights": 3 << 30,
            "reserve": 512 << 20,
            "free_after": -(3 << 29),
            "card_total": 8 << 30,
            "limit": 2 << 30,
        }
        return FakeDecision(
            FakeVerdict("does not fit"),
            bd,
            0,
            kw["context"],
            True,
            ("raise the memory limit from 2 GiB to 3.55 GiB",),
            "the model needs 1.5 GiB more than the 2 GiB memory limit allows",
        )

    window = make_window(gpu_source=FakeGpu, planner=plan)
    qtbot.waitUntil(lambda: window.ctx.machine.gpu is not None, timeout=3000)
    window.choose(Entry("folder:/m", "my-model", "", 1 << 30, "folder", local_dir="/m"))
    panel = window.load
    qtbot.waitUntil(lambda: panel.badge.text() == "Does not fit", timeout=3000)
    assert "The red line is what the memory limit allows" in panel.detail.text()


def test_the_load_panel_plans_the_sizes_the_settings_hold(qtbot, make_window):
    """A context or a stream count the settings allow but the panel's controls did not
    (a short context, many streams for the server): the panel plans what the Models tab
    plans, not a value its control clamped."""
    calls: list = []
    window = make_window(gpu_source=FakeGpu, planner=fake_planner(calls))
    qtbot.waitUntil(lambda: window.ctx.machine.gpu is not None, timeout=3000)
    window.ctx.settings.set("engine/context", 100)
    window.ctx.settings.set("engine/streams", 32)
    window.choose(Entry("folder:/m", "my-model", "", 1 << 30, "folder", local_dir="/m"))
    panel = window.load
    qtbot.waitUntil(lambda: panel.badge.text() == "Fits", timeout=3000)  # 3,200 <= 16,384
    asked = {(c["context"], c["streams"]) for c in calls if c.get("model_dir") == "/m"}
    assert asked == {(100, 32)}
    assert (panel.context_spin.value(), panel.streams_spin.value()) == (100, 32)


def test_a_long_reason_neither_widens_the_library_nor_is_cut_off(qtbot, make_window):
    """A card with a long reason keeps to the list's width (no scrolling sideways, every
    badge in view), its reason wrapped on as many lines as it takes, at any width."""

    def plan(**kw):
        long = "needs 1.00 GiB more than this card can give, " * 6
        return FakeDecision(FakeVerdict("does not fit"), {}, 1, kw["context"], False, (), long)

    window = make_window(gpu_source=FakeGpu, planner=plan)
    window.tabs.setCurrentWidget(window.library)
    panel = window.library
    qtbot.waitUntil(lambda: panel.card("qwen3.5-0.8b-4bit").badge.text() == "Does not fit")
    for width in (1280, 960):
        window.resize(width, 800)
        qtbot.wait(50)
        room = panel.list.viewport().width()
        assert panel.list.horizontalScrollBar().maximum() == 0
        for i in range(panel.list.count()):
            card = panel.list.itemWidget(panel.list.item(i))
            assert card.geometry().right() <= room, card.entry.key
            assert card.height() >= card.heightForWidth(card.width()), card.entry.key
