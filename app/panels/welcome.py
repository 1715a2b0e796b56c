"""First-run view: what this machine has, which model to start with and why, one click to get it.

Shown in place of the chat until a model is loaded or the user dismisses it (remembered in
the settings store under DONE_KEY). It takes the Machine, the FitAdvisor, the Library and the
DownloadManager; it asks the window to load a model through `load_requested`.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.controllers import DownloadManager
from app.panels.library import restyle, verdict_kind
from app.planning import fmt_bytes
from app.state.catalog import Entry, Library
from app.state.fit import FitAdvisor, verdict_label
from app.state.recommend import WELCOME_CONTEXT, Recommendation, recommend
from app.widgets.flow_layout import FlowLayout

DONE_KEY = "ui/welcome_done"


def welcome_done(store: QSettings) -> bool:
    return str(store.value(DONE_KEY, "false")).lower() in ("1", "true")


class WelcomePanel(QWidget):
    """Reads the machine, recommends a model, downloads and loads it with one click."""

    load_requested = Signal(object)  # Entry
    dismissed = Signal()
    browse = Signal()

    def __init__(
        self,
        advisor: FitAdvisor,
        library: Library,
        downloads: DownloadManager,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("welcome")
        self.advisor, self.library, self.downloads = advisor, library, downloads
        self.machine = advisor.machine
        self.recommendation = Recommendation(None, "", pending=True)
        self._waiting_for: str | None = None  # the repo being downloaded for this view
        outer = QVBoxLayout(self)
        outer.setContentsMargins(48, 40, 48, 40)
        outer.setSpacing(14)
        title = QLabel("Welcome to Snug")
        title.setObjectName("welcomeTitle")
        outer.addWidget(title)
        self.machine_label = QLabel()
        self.machine_label.setObjectName("welcomeMachine")
        self.machine_label.setWordWrap(True)
        outer.addWidget(self.machine_label)

        card = QFrame()
        card.setObjectName("welcomeCard")
        cl = QVBoxLayout(card)
        cl.setContentsMargins(18, 16, 18, 16)
        cl.setSpacing(8)
        top = QHBoxLayout()
        self.model_label = QLabel("Checking which models fit…")
        self.model_label.setObjectName("welcomeModel")
        self.model_label.setWordWrap(True)  # a narrow window's column: on two lines
        top.addWidget(self.model_label, 1)
        self.badge = QLabel()
        self.badge.setObjectName("badge")
        self.badge.hide()
        top.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignTop)  # by the name's first line
        cl.addLayout(top)
        self.why = QLabel()
        self.why.setObjectName("welcomeWhy")
        self.why.setWordWrap(True)
        cl.addWidget(self.why)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(8)
        self.progress.hide()
        cl.addWidget(self.progress)
        self.status = QLabel()
        self.status.setObjectName("subtle")
        self.status.setWordWrap(True)
        self.status.hide()
        cl.addWidget(self.status)
        # In a row, and on as many lines as the column's width takes (a small window): a
        # row wider than the column would squeeze the card and cut its text.
        buttons = FlowLayout(spacing=8)
        self.go_button = QPushButton("Download and load")
        self.go_button.setObjectName("primary")
        self.go_button.setEnabled(False)
        self.go_button.clicked.connect(self.go)
        self.other_button = QPushButton("Choose another model")
        self.other_button.clicked.connect(self.browse)
        self.later_button = QPushButton("Not now")
        self.later_button.clicked.connect(self.dismissed)
        buttons.addWidget(self.go_button)
        buttons.addWidget(self.other_button)
        buttons.addWidget(self.later_button)
        cl.addLayout(buttons)
        outer.addWidget(card)
        outer.addStretch(1)

        advisor.changed.connect(self.refresh)
        advisor.decided.connect(self.refresh)
        self.machine.updated.connect(self._machine_text)
        library.changed.connect(self.refresh)
        downloads.progress.connect(self._dl_progress)
        downloads.finished.connect(self._dl_finished)
        downloads.failed.connect(self._dl_failed)
        downloads.cancelled.connect(self._dl_failed)
        self._machine_text()
        self.refresh()

    # -- view
    def _machine_text(self) -> None:
        m = self.machine
        if m.gpu is not None:
            gpu = m.gpu
            text = (
                f"Your GPU: {gpu.name}, {fmt_bytes(gpu.total_bytes)} of memory, "
                f"{fmt_bytes(gpu.free_bytes)} free now."
            )
        elif m.no_gpu:
            text = (
                f"No NVIDIA GPU found: Snug will run models on the CPU. "
                f"RAM available now: {fmt_bytes(m.ram_available())}."
            )
        else:
            text = "Looking for an NVIDIA GPU…"
        self.machine_label.setText(text)

    def refresh(self) -> None:
        if self._waiting_for is not None:
            return  # a download for the chosen model is under way: keep the choice on show
        on_cpu = self.advisor.on_cpu()
        rec = recommend(
            self.library.entries(),
            lambda e: self.advisor.verdict(e, WELCOME_CONTEXT, 1),
            on_cpu,
        )
        self.recommendation = rec
        self.why.setText(rec.why)
        entry = rec.entry
        if entry is None:
            self.model_label.setText(
                "Checking which models fit…" if rec.pending else "No recommendation"
            )
            self.badge.hide()
            self.go_button.setEnabled(False)
            return
        decision = self.advisor.verdict(entry, WELCOME_CONTEXT, 1)
        self.model_label.setText(f"Recommended: {entry.title}")
        self.badge.setText(verdict_label(decision))
        self.badge.setProperty("kind", verdict_kind(decision))
        restyle(self.badge)
        self.badge.show()
        busy = self.downloads.active is not None
        self.go_button.setEnabled(not busy)
        self.go_button.setText(
            "Load it" if entry.downloaded else f"Download ({fmt_bytes(entry.size_bytes)}) and load"
        )

    # -- actions
    def go(self) -> None:
        entry = self.recommendation.entry
        if entry is None:
            return
        if entry.downloaded:
            self._say(f"Loading {entry.title}…")
            self.load_requested.emit(entry)
            return
        if entry.repo is None or not self.downloads.download(entry.repo):
            self._say("Another download is under way; wait for it or cancel it under Models.")
            return
        self._waiting_for = entry.repo
        self.go_button.setEnabled(False)
        self.progress.setValue(0)
        self.progress.show()
        self._say(f"Downloading {entry.repo}…")

    def _say(self, text: str) -> None:
        self.status.setText(text)
        self.status.setVisible(bool(text))

    def _dl_progress(self, repo: str, done: int, total: int, _speed: float) -> None:
        if repo == self._waiting_for:
            self.progress.setValue(int(1000 * done / max(total, 1)))
            self._say(f"Downloading {repo}: {fmt_bytes(done)} of {fmt_bytes(total)}")

    def _dl_finished(self, repo: str, _folder: str) -> None:
        if repo != self._waiting_for:
            return
        self._waiting_for = None
        self.progress.hide()
        entry = self._downloaded(repo)
        if entry is None:
            self._say(f"{repo} was downloaded, but Snug cannot find it in the cache.")
            return
        self._say(f"Loading {entry.title}…")
        self.load_requested.emit(entry)

    def _downloaded(self, repo: str) -> Entry | None:
        for attempt in range(2):
            entry = next((e for e in self.library.entries() if e.repo == repo), None)
            if entry is not None and entry.downloaded:
                return entry
            if attempt == 0:
                self.library.rescan()
        return None

    def _dl_failed(self, repo: str, message: str = "Paused.") -> None:
        if repo != self._waiting_for:
            return
        self._waiting_for = None
        self.progress.hide()
        self._say(message)
        self.refresh()

    def load_failed(self, message: str) -> None:
        self._say(message)
        self.refresh()

    def text(self) -> str:
        """Everything the view says, in words (tests and the accessibility name read it)."""
        return "\n".join(
            w.text()
            for w in (self.machine_label, self.model_label, self.badge, self.why, self.status)
            if not w.isHidden()
        )
