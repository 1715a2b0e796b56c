"""Model library: catalog, HF cache and local folders, with a fit verdict before download."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import planning
from app.controllers import DownloadManager
from app.planning import fmt_bytes
from app.state.catalog import Entry, Library
from app.state.fit import FitAdvisor

VERDICT_KIND = {
    "fits": "good",
    "fits with lazy scratch": "ok",
    "fits with host embeddings": "ok",
    "does not fit": "bad",
}


def verdict_kind(decision: object) -> str:
    if isinstance(decision, planning.PlanProblem):
        return "cpu" if decision.verdict_label == "CPU mode" else "unknown"
    return VERDICT_KIND.get(planning.verdict_value(decision), "unknown")


class EntryCard(QFrame):
    """One library row: name, size and state, the verdict badge and its reason."""

    def __init__(self, entry: Entry, decision: object, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("entryCard")
        self.entry = entry
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(2)
        top = QHBoxLayout()
        title = QLabel(entry.title)
        title.setObjectName("entryTitle")
        top.addWidget(title, 1)
        self.badge = QLabel(planning.verdict_label(decision))
        self.badge.setObjectName("badge")
        self.badge.setProperty("kind", verdict_kind(decision))
        top.addWidget(self.badge)
        layout.addLayout(top)
        where = {
            "catalog": "Downloaded" if entry.downloaded else "Not downloaded",
            "cache": "In the Hugging Face cache",
            "folder": "Local folder",
        }[entry.source]
        size = ("≈ " if not entry.downloaded else "") + fmt_bytes(entry.size_bytes)
        self.meta = QLabel(f"{size} · {where}")
        self.meta.setObjectName("subtle")
        layout.addWidget(self.meta)
        reason = str(getattr(decision, "reason", "") or "")
        self.reason = QLabel(reason)
        self.reason.setObjectName("reason")
        self.reason.setWordWrap(True)
        # CPU mode is said once by the gauge; the cards keep only the badge.
        self.reason.setVisible(bool(reason) and verdict_kind(decision) not in ("good", "cpu"))
        layout.addWidget(self.reason)
        self.setToolTip(f"{entry.repo or entry.local_dir}\n{reason}".strip())


class LibraryPanel(QWidget):
    """Takes the Library, the DownloadManager and the FitAdvisor; `chosen` picks a model."""

    chosen = Signal(object)  # Entry

    def __init__(
        self,
        library: Library,
        downloads: DownloadManager,
        advisor: FitAdvisor,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.library, self.downloads, self.advisor = library, downloads, advisor
        self.decisions: dict[str, object] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.setSpacing(8)
        hint = QLabel("Qwen3.5 models. The badge says whether each one fits this machine.")
        hint.setObjectName("subtle")
        hint.setWordWrap(True)
        layout.addWidget(hint)
        self.list = QListWidget()
        self.list.setObjectName("libraryList")
        self.list.setSpacing(3)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemDoubleClicked.connect(lambda *_: self._use())
        layout.addWidget(self.list, 1)

        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(8)
        self.progress_label = QLabel()
        self.progress_label.setObjectName("subtle")
        self.message = QLabel()
        self.message.setObjectName("errorText")
        self.message.setWordWrap(True)
        for w in (self.progress, self.progress_label, self.message):
            w.hide()
            layout.addWidget(w)

        row = QHBoxLayout()
        self.use_button = QPushButton("Use")
        self.use_button.setObjectName("primary")
        self.use_button.setToolTip("Check the fit and load this model")
        self.use_button.clicked.connect(self._use)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self._download)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(downloads.cancel)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._delete)
        for b in (self.use_button, self.download_button, self.cancel_button, self.delete_button):
            row.addWidget(b)
        layout.addLayout(row)
        self.open_button = QPushButton("Open local folder…")
        self.open_button.clicked.connect(self._open_folder)
        layout.addWidget(self.open_button)

        library.changed.connect(self.refresh)
        advisor.changed.connect(self.refresh)
        downloads.started.connect(self._dl_started)
        downloads.progress.connect(self._dl_progress)
        downloads.finished.connect(self._dl_finished)
        downloads.failed.connect(self._dl_failed)
        downloads.cancelled.connect(self._dl_cancelled)
        self.refresh()

    # -- view
    def refresh(self) -> None:
        current = self.selected()
        self.list.clear()
        for entry in self.library.entries():
            decision = self.advisor.decide(entry)
            self.decisions[entry.key] = decision
            item = QListWidgetItem()
            item.setData(Qt.ItemDataRole.UserRole, entry.key)
            card = EntryCard(entry, decision)
            item.setSizeHint(card.sizeHint())
            self.list.addItem(item)
            self.list.setItemWidget(item, card)
            if current is not None and current.key == entry.key:
                self.list.setCurrentItem(item)
        if self.library.scan_error:
            self._say(f"Could not read the Hugging Face cache: {self.library.scan_error}")
        self._update_buttons()

    def selected(self) -> Entry | None:
        item = self.list.currentItem()
        return self.library.find(item.data(Qt.ItemDataRole.UserRole)) if item else None

    def select(self, key: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.ItemDataRole.UserRole) == key:
                self.list.setCurrentRow(i)

    def card(self, key: str) -> EntryCard | None:
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == key:
                return self.list.itemWidget(item)
        return None

    def _current_changed(self, item, previous) -> None:
        for it, on in ((previous, False), (item, True)):
            card = self.list.itemWidget(it) if it is not None else None
            if card is not None:
                card.setProperty("selected", on)
                card.style().unpolish(card)
                card.style().polish(card)
        self._update_buttons()

    def _update_buttons(self) -> None:
        entry = self.selected()
        busy = self.downloads.active is not None
        self.use_button.setEnabled(entry is not None and entry.downloaded)
        self.download_button.setEnabled(
            entry is not None and not entry.downloaded and entry.repo is not None and not busy
        )
        self.cancel_button.setEnabled(busy)
        self.delete_button.setEnabled(entry is not None and entry.downloaded)

    def _say(self, text: str) -> None:
        self.message.setText(text)
        self.message.setVisible(bool(text))

    # -- actions
    def _use(self) -> None:
        entry = self.selected()
        if entry is not None and entry.downloaded:
            self.chosen.emit(entry)

    def _download(self) -> None:
        entry = self.selected()
        if entry is None or entry.repo is None:
            return
        self._say("")
        if self.downloads.download(entry.repo):
            self.progress_label.setText(f"Preparing {entry.repo}…")
            self.progress_label.show()
        self._update_buttons()

    def _delete(self) -> None:
        entry = self.selected()
        if entry is None:
            return
        answer = QMessageBox.question(
            self,
            "Delete model",
            f"Delete {entry.title} ({fmt_bytes(entry.size_bytes)}) from disk?",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self._say(self.library.delete(entry))

    def _open_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a model folder")
        if folder:
            self.add_folder(folder)

    def add_folder(self, folder: str) -> None:
        entry = self.library.add_folder(folder)
        self.select(entry.key)

    # -- download signals
    def _dl_started(self, repo: str, total: int) -> None:
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        self.progress.show()
        self.progress_label.setText(f"Downloading {repo} · {fmt_bytes(total)}")
        self.progress_label.show()
        self._update_buttons()

    def _dl_progress(self, repo: str, done: int, total: int, speed: float) -> None:
        self.progress.setValue(int(1000 * done / max(total, 1)))
        self.progress_label.setText(
            f"{repo.split('/')[-1]}: {fmt_bytes(done)} of {fmt_bytes(total)} · {fmt_bytes(speed)}/s"
        )

    def _dl_finished(self, repo: str, _folder: str) -> None:
        self.progress.hide()
        self.progress_label.setText(f"{repo} downloaded.")
        self.library.rescan()

    def _dl_failed(self, repo: str, message: str) -> None:
        self.progress.hide()
        self.progress_label.hide()
        self._say(message)
        self._update_buttons()

    def _dl_cancelled(self, repo: str) -> None:
        self.progress.hide()
        self.progress_label.setText(f"Paused {repo}; Download again to resume.")
        self._update_buttons()
