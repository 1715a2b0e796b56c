"""Load panel: the admission decision for the chosen model, live as the sizes change."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app import planning
from app.controllers import EngineController
from app.engine_bridge import LoadRequest
from app.panels.library import restyle, verdict_kind
from app.state import host_fit
from app.state.catalog import Entry
from app.state.fit import CHECKING, FitAdvisor, verdict_label
from app.state.settings import BY_KEY
from app.widgets.number_box import IntBox
from app.widgets.stacked_bar import Legend, StackedBar
from engine.memory.decision import streams_text

CONTEXT_STEPS = [512 << i for i in range(10)]  # 512 ... 262144


class LoadPanel(QWidget):
    """Takes the FitAdvisor (planning) and the EngineController (load / unload)."""

    def __init__(
        self, advisor: FitAdvisor, engine: EngineController, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.advisor, self.engine = advisor, engine
        self.settings = advisor.settings
        self.entry: Entry | None = None
        self.decision: object = None
        self._drawn_for: Entry | None = None
        self._shown_state = ""  # the engine state the stage line was last written for
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.setSpacing(8)
        self.model_label = QLabel("No model chosen. Pick one under Models.")
        self.model_label.setObjectName("panelTitle")
        self.model_label.setWordWrap(True)
        layout.addWidget(self.model_label)

        form = QFormLayout()
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
        form.setHorizontalSpacing(12)
        ctx_row = QHBoxLayout()
        self.context_slider = QSlider(Qt.Orientation.Horizontal)
        self.context_slider.setRange(0, len(CONTEXT_STEPS) - 1)
        self.context_spin = IntBox()
        # The settings' own ranges, so the panel plans what the Models tab plans (a context
        # past the model's own limit is planned at that limit by both).
        self.context_spin.setRange(int(BY_KEY["engine/context"].lo or 1), CONTEXT_STEPS[-1])
        self.context_spin.setSingleStep(1024)
        self.context_spin.setSuffix(" tokens")
        self.context_spin.setMinimumWidth(112)
        ctx_row.addWidget(self.context_slider, 1)
        ctx_row.addWidget(self.context_spin)
        form.addRow("Context", ctx_row)
        self.streams_spin = IntBox()
        self.streams_spin.setRange(1, int(BY_KEY["engine/streams"].hi or 1))
        self.streams_spin.setMaximumWidth(112)
        form.addRow("Streams", self.streams_spin)
        self.rows_spin = IntBox()
        self.rows_spin.setRange(0, int(BY_KEY["engine/max_rows"].hi or 0))
        self.rows_spin.setSingleStep(64)
        # 0: the plan chooses (512 rows, wider where the card has memory left over)
        self.rows_spin.setSpecialValueText("Auto")
        self.rows_spin.setMaximumWidth(112)
        form.addRow("Max rows", self.rows_spin)
        layout.addLayout(form)

        verdict_row = QHBoxLayout()
        self.badge = QLabel("—")
        self.badge.setObjectName("badge")
        verdict_row.addWidget(self.badge)
        verdict_row.addStretch(1)
        layout.addLayout(verdict_row)
        self.reason = QLabel()
        self.reason.setObjectName("reason")
        self.reason.setWordWrap(True)
        layout.addWidget(self.reason)
        self.bar = StackedBar(22)
        layout.addWidget(self.bar)
        self.legend = Legend(columns=2)
        layout.addWidget(self.legend)
        self.detail = QLabel()
        self.detail.setObjectName("subtle")
        self.detail.setWordWrap(True)
        layout.addWidget(self.detail)
        self.suggestions = QLabel()
        self.suggestions.setObjectName("suggestions")
        self.suggestions.setWordWrap(True)
        layout.addWidget(self.suggestions)
        layout.addStretch(1)

        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setFixedHeight(8)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.stage = QLabel()
        self.stage.setObjectName("subtle")
        self.stage.setWordWrap(True)  # "Loaded on ... · why drafting is unavailable" is long
        self.error = QLabel()
        self.error.setObjectName("errorText")
        self.error.setWordWrap(True)
        self.error.hide()
        for w in (self.progress, self.stage, self.error):
            layout.addWidget(w)
        buttons = QHBoxLayout()
        self.load_button = QPushButton("Load")
        self.load_button.setObjectName("primary")
        self.load_button.clicked.connect(self.load)
        self.unload_button = QPushButton("Unload")  # "Cancel" while a load runs
        self.unload_button.clicked.connect(self._unload_or_cancel)
        buttons.addWidget(self.load_button, 1)
        buttons.addWidget(self.unload_button)
        layout.addLayout(buttons)

        self._sync_from_settings()
        self.context_slider.valueChanged.connect(
            lambda i: self.context_spin.setValue(CONTEXT_STEPS[i])
        )
        self.context_spin.valueChanged.connect(lambda v: self.settings.set("engine/context", v))
        self.streams_spin.valueChanged.connect(lambda v: self.settings.set("engine/streams", v))
        self.rows_spin.valueChanged.connect(lambda v: self.settings.set("engine/max_rows", v))
        self.settings.changed.connect(lambda *_: self._sync_from_settings())
        advisor.changed.connect(self.replan)
        advisor.decided.connect(self.replan)
        advisor.library.changed.connect(self._library_changed)
        engine.state_changed.connect(self._state)
        engine.load_progress.connect(self._progress)
        engine.loaded.connect(self._loaded)
        engine.load_failed.connect(self._failed)
        self._state(engine.state)
        self.replan()

    def _sync_from_settings(self) -> None:
        s = self.settings
        for spin, value in (
            (self.context_spin, s.context),
            (self.streams_spin, s.streams),
            (self.rows_spin, s.max_rows),
        ):
            if spin.value() != value:
                spin.blockSignals(True)
                spin.setValue(value)
                spin.blockSignals(False)
        nearest = min(range(len(CONTEXT_STEPS)), key=lambda i: abs(CONTEXT_STEPS[i] - s.context))
        self.context_slider.blockSignals(True)
        self.context_slider.setValue(nearest)
        self.context_slider.blockSignals(False)

    def set_entry(self, entry: Entry | None) -> None:
        self.entry = entry
        self.error.hide()
        self.replan()

    def _library_changed(self) -> None:
        """The model on show as the library lists it now: deleted from disk (Load waits
        for a download), downloaded again, or gone with its folder."""
        entry = self.entry
        if entry is None:
            return
        now = self.advisor.library.find(entry.key)
        if now is None and entry.local_dir is not None and Path(entry.local_dir).is_dir():
            return  # a folder taken off the list: its files are still there to load
        if now != entry:
            self.set_entry(now)

    # -- planning
    def replan(self) -> None:
        """Ask the advisor for the verdict at the panel's sizes (planned off the UI thread;
        `decided` calls this again when it lands)."""
        entry = self.entry
        if entry is None:
            self.model_label.setText("No model chosen. Pick one under Models.")
            self.decision = None
            self._show(None)
            self._state(self.engine.state)
            return
        self.model_label.setText(entry.title)
        decision = self.advisor.verdict(
            entry, self.context_spin.value(), self.streams_spin.value(), self.rows_spin.value()
        )
        if decision is not self.decision:
            self.decision = decision
            self._show(decision)
        self._state(self.engine.state)

    def _show(self, decision: object) -> None:
        if decision is None:
            self.badge.setText("—")
            self.badge.setProperty("kind", "unknown")
            for w in (self.reason, self.bar, self.legend, self.suggestions, self.detail):
                w.hide()
            restyle(self.badge)
            return
        self.badge.setText(verdict_label(decision))
        self.badge.setProperty("kind", verdict_kind(decision))
        restyle(self.badge)
        self.reason.setText(str(getattr(decision, "reason", "") or ""))
        self.reason.setVisible(bool(self.reason.text()))
        if decision is CHECKING:
            if self._drawn_for != self.entry:  # the bar drawn is another model's
                for w in (self.bar, self.legend, self.suggestions, self.detail):
                    w.hide()
            return  # this model's last bar stays up until the new verdict replaces it
        self._drawn_for = self.entry
        if isinstance(decision, host_fit.HostDecision):
            self._show_host(decision)
        else:
            self._show_card(decision)
        tips = tuple(getattr(decision, "suggestions", ()) or ())
        self.suggestions.setText("To make it fit:\n" + "\n".join(f"• {t}" for t in tips))
        self.suggestions.setVisible(bool(tips))

    def _show_card(self, decision: object) -> None:
        has_bytes = not isinstance(decision, planning.PlanProblem)
        self.bar.setVisible(has_bytes)
        self.legend.setVisible(has_bytes)
        self.detail.setVisible(False)
        if not has_bytes:
            return
        parts = [
            (label, planning.breakdown_value(decision, key), colour)
            for key, label, colour in planning.BAR_PARTS
        ]
        card = planning.breakdown_value(decision, "card_total")
        limit = planning.breakdown_value(decision, "limit")
        edge = min(card, limit) if limit else card
        total = max(card, sum(max(b, 0) for _, b, _ in parts))
        # The red line is what the engine may use (the card, or the limit when lower);
        # when the model does not fit, the parts run past it.
        marker = (edge, "#d64545") if edge and (edge < total) else None
        self.bar.set_segments(parts, total=total or None, marker=marker)
        self.legend.set_items(
            [
                ("Missing", -b, "#d64545") if label == "Free" and b < 0 else (label, b, c)
                for label, b, c in parts
            ]
        )
        streams = int(getattr(decision, "streams", 0) or 0)
        each = planning.breakdown_value(decision, "stream_state_each")
        context = int(getattr(decision, "context", 0) or 0)
        lines = []
        if streams and each:
            lines.append(
                f"{streams_text(streams)} × {planning.fmt_bytes(each)} of state at "
                f"{context:,} tokens · working memory "
                + ("set aside at load" if getattr(decision, "eager", False) else "grows as needed")
            )
        prediction = getattr(decision, "prediction", None)
        if prediction is not None:  # the plan's cost model, scaled to this card
            sentence = prediction.sentence()
            lines.append(sentence[0].upper() + sentence[1:] + ".")
        drafting = str(getattr(decision, "drafting", "") or "")
        if drafting:  # drafting with the MTP head, or why it is unavailable
            lines.append(drafting[0].upper() + drafting[1:] + ".")
        if marker is not None:
            cap = "the memory limit allows" if limit and limit < card else "this card can give"
            lines.append(f"The red line is what {cap}; the rest is missing.")
        self.detail.setText("\n".join(lines))
        self.detail.setVisible(bool(lines))

    def _show_host(self, decision: host_fit.HostDecision) -> None:
        b = decision.breakdown
        free = b["free_after"]
        parts = [
            ("Weights", b["weights"], "#4f6bed"),
            ("Stream state", b["stream_state_total"], "#2aa198"),
            ("Margin", b["margin"], "#9aa3ad"),
            ("Missing" if free < 0 else "Free", abs(free), "#d64545" if free < 0 else "#dfe5ea"),
        ]
        total = max(b["available"], b["need"])
        marker = (b["available"], "#d64545") if free < 0 else None
        self.bar.set_segments(parts, total=total or None, marker=marker)
        self.legend.set_items(parts)
        self.bar.show()
        self.legend.show()
        self.detail.setText(
            f"RAM available: {planning.fmt_bytes(b['available'])}. An estimate for the CPU "
            "backend: weights widened to float32 (4-bit kept packed), float32 state, a margin."
        )
        self.detail.show()

    # -- loading
    def load(self) -> None:
        if self.entry is None or self.entry.local_dir is None:
            return
        self.error.hide()
        s = self.settings
        self.engine.load(
            LoadRequest(
                model_dir=self.entry.local_dir,
                settings=s.engine_settings(),
                context=self.context_spin.value(),
                streams=self.streams_spin.value(),
                max_rows=self.rows_spin.value(),  # 0, "Auto": the plan chooses (LoadRequest)
                refuse_cpu=s.refuse_cpu,
                gpu_present=self.advisor.machine.gpu is not None,
            )
        )
        s.set("model/last_dir", self.entry.local_dir)

    def _state(self, state: str) -> None:
        ready = self.entry is not None and self.entry.downloaded
        refused = planning.verdict_value(self.decision) == "does not fit"
        self.load_button.setEnabled(ready and state != "loading" and not refused)
        same = ready and self.engine.info.get("model_dir") == self.entry.local_dir
        self.load_button.setText("Reload" if same and state in ("ready", "generating") else "Load")
        self.unload_button.setEnabled(state in ("ready", "generating", "loading"))
        self.unload_button.setText("Cancel" if state == "loading" else "Unload")
        self.unload_button.setToolTip(
            "Stop loading: what the load allocated is released"
            if state == "loading"
            else "Release the model's memory"
        )
        self.progress.setVisible(state == "loading")
        # The line under the buttons speaks of the model on show: the download it needs, the
        # load under way, or (where it is the model in) what the load gave; else nothing.
        if state == "loading":
            if self._shown_state != "loading":  # progress (`_progress`) writes it from here
                self.stage.setText("Loading…")
        elif self.entry is not None and not self.entry.downloaded:
            self.stage.setText("Download this model first (Models tab) to load it.")
        elif same and state in ("ready", "generating"):
            self.stage.setText(loaded_line(self.engine.info))
        elif not self.error.isVisible():
            self.stage.setText("")
        self._shown_state = state

    def _progress(self, stage: str, fraction: float) -> None:
        self.progress.setValue(int(fraction * 100))
        self.stage.setText(f"{stage.capitalize()}… {fraction:.0%}")

    def _loaded(self, info: dict) -> None:
        self.stage.setText(loaded_line(info))

    def _unload_or_cancel(self) -> None:
        if self.engine.state == "loading":
            self.engine.cancel_load()
        else:
            self.engine.unload()

    def _failed(self, cls: str, message: str) -> None:
        self.stage.setText("")
        if cls == "LoadCancelled":  # asked for: said on the stage line, not as an error
            self.error.hide()
            self.stage.setText("Load cancelled.")
            return
        self.error.setText(f"Could not load the model ({cls}): {message}")
        self.error.show()


def loaded_line(info: dict) -> str:
    """What a load gave, from the engine's report (EngineController.info)."""
    names = {"cuda": "GPU (CUDA)", "remote": "a remote server (nothing held here)"}
    backend = names.get(info.get("backend"), "CPU mode (numpy backend)")
    text = f"Loaded on {backend} · holds {planning.fmt_bytes(info.get('held', 0))}"
    drafting = str(info.get("drafting") or "")
    return text + (f" · {drafting}" if drafting else "")
