"""Live VRAM gauge: total, Snug, other programs, free, the reserve line, a 60 s history."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

from app.planning import fmt_bytes
from app.state.machine import Machine
from app.theme import THEME, colour
from app.widgets.stacked_bar import Legend, StackedBar

SNUG, OTHERS, FREE, RESERVE = "#4f6bed", "#e08a2e", "#dfe5ea", "#d64545"
GIB = 1 << 30


class GaugePanel(QFrame):
    """Draws a Machine model; never talks to NVML or the engine itself."""

    def __init__(self, machine: Machine, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("gaugePanel")
        self.machine = machine
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 12, 14, 12)
        layout.setSpacing(6)
        self.title = QLabel("GPU memory")
        self.title.setObjectName("panelTitle")
        layout.addWidget(self.title)
        self.subtitle = QLabel("Looking for an NVIDIA GPU…")
        self.subtitle.setObjectName("subtle")
        self.subtitle.setWordWrap(True)
        layout.addWidget(self.subtitle)
        self.bar = StackedBar(16)
        layout.addWidget(self.bar)
        self.legend = Legend(columns=2)
        layout.addWidget(self.legend)

        pg.setConfigOptions(antialias=True)
        self.plot = pg.PlotWidget(background=colour("#ffffff"))
        THEME.changed.connect(self._theme_changed)  # a method: let go of when the gauge is
        self.plot.setObjectName("vramPlot")
        self.plot.setFixedHeight(96)
        self.plot.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # nothing to do there by keyboard
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.setMenuEnabled(False)
        item = self.plot.getPlotItem()
        item.showGrid(x=False, y=True, alpha=0.15)
        item.setDownsampling(auto=True, mode="peak")  # 60 s of samples, drawn at the plot's width
        item.setClipToView(True)
        item.getAxis("bottom").setStyle(showValues=False)
        item.getAxis("left").setWidth(34)
        item.getAxis("left").setLabel("GiB")
        self.used_curve = self.plot.plot(pen=pg.mkPen(OTHERS, width=2), name="used")
        self.ours_curve = self.plot.plot(
            pen=pg.mkPen(SNUG, width=2), fillLevel=0, brush=pg.mkBrush(79, 107, 237, 50)
        )
        self.reserve_line = pg.InfiniteLine(
            angle=0, pen=pg.mkPen(RESERVE, width=1, style=pg.QtCore.Qt.PenStyle.DashLine)
        )
        self.plot.addItem(self.reserve_line)
        layout.addWidget(self.plot)

        self.cpu_note = QLabel()
        self.cpu_note.setObjectName("cpuNote")
        self.cpu_note.setWordWrap(True)
        self.cpu_note.hide()
        layout.addWidget(self.cpu_note)
        machine.updated.connect(self.refresh)
        self.refresh()

    def _theme_changed(self, _dark: bool) -> None:
        self.plot.setBackground(colour("#ffffff"))

    def refresh(self) -> None:
        m = self.machine
        gpu = m.gpu
        if gpu is None:
            has_reason = bool(m.no_gpu)
            self.subtitle.setText("CPU mode" if has_reason else "Looking for an NVIDIA GPU…")
            self.cpu_note.setText(m.no_gpu.split(". (")[0] if has_reason else "")
            self.cpu_note.setVisible(has_reason)
            for w in (self.bar, self.legend, self.plot):
                w.setVisible(False)
            if m.engine_held and has_reason:
                self.cpu_note.setText(
                    f"{self.cpu_note.text()}\nSnug holds {fmt_bytes(m.engine_held)} of host memory."
                )
            return
        for w in (self.bar, self.legend, self.plot):
            w.setVisible(True)
        self.cpu_note.setVisible(False)
        total = gpu.total_bytes
        self.subtitle.setText(f"{gpu.name} · {fmt_bytes(total)} total")
        parts = [
            ("Snug", m.ours, SNUG),
            ("Other programs", m.others, OTHERS),
            ("Free", gpu.free_bytes, FREE),
        ]
        self.bar.set_segments(parts, total=total, marker=(total - m.reserve_bytes, RESERVE))
        self.legend.set_items(parts + [("Reserve", m.reserve_bytes, RESERVE)])
        if m.history:
            t0 = m.history[-1][0]
            xs = [t - t0 for t, _u, _o in m.history]
            self.used_curve.setData(xs, [u / GIB for _t, u, _o in m.history])
            self.ours_curve.setData(xs, [o / GIB for _t, _u, o in m.history])
        self.reserve_line.setPos((total - m.reserve_bytes) / GIB)
        self.plot.setYRange(0, total / GIB, padding=0.02)
        self.plot.setXRange(-60, 0, padding=0)

    def state_text(self) -> str:
        """What the gauge says, in words (used by tests and the accessibility name)."""
        if self.machine.gpu is None:
            return self.cpu_note.text() or self.subtitle.text()
        return self.subtitle.text()
