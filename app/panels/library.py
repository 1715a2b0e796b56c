"""Model library: catalog, HF cache and local folders, with a fit verdict before download."""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QInputDialog,
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
from app.state import host_fit
from app.state.catalog import Entry, FolderRefused, Library
from app.state.fit import FitAdvisor, verdict_label
from app.workers.hub_probe import RepoInfo, RepoRefused, probe_repo

HINT = "Qwen3.5 models. The badge says whether each one fits this machine."
CPU_HINT = (
    "No NVIDIA GPU: each badge compares a model with this machine's available RAM "
    "({ram}), as an estimate: weights as the CPU backend holds them, plus the state at "
    "{context:,} tokens, plus a margin."
)

VERDICT_KIND = {
    "fits": "good",
    "fits with lazy scratch": "ok",
    "fits with host embeddings": "ok",
    "does not fit": "bad",
    host_fit.FITS_IN_RAM: "cpu",
    host_fit.TOO_LARGE_FOR_RAM: "bad",
}


def verdict_kind(decision: object) -> str:
    if isinstance(decision, planning.PlanProblem):
        return "cpu" if decision.verdict_label == "CPU mode" else "unknown"
    if isinstance(decision, host_fit.HostDecision):
        return VERDICT_KIND[decision.verdict]
    return VERDICT_KIND.get(planning.verdict_value(decision), "unknown")


def restyle(widget: QWidget) -> None:
    """Apply a changed dynamic property (the style sheet keys on it)."""
    widget.style().unpolish(widget)
    widget.style().polish(widget)


def _partial(entry: Entry | None) -> bool:
    """An interrupted download: files in the cache, none of its revisions loadable."""
    return entry is not None and bool(entry.problem) and entry.repo is not None


class EntryCard(QFrame):
    """One library row: name, size and state, the verdict badge and its reason."""

    def __init__(self, entry: Entry, decision: object, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("entryCard")
        self.entry = entry
        self.decision: object = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(2)
        top = QHBoxLayout()
        title = QLabel(entry.title)
        title.setObjectName("entryTitle")
        top.addWidget(title, 1)
        self.badge = QLabel()
        self.badge.setObjectName("badge")
        top.addWidget(self.badge)
        layout.addLayout(top)
        where = {
            "catalog": "Downloaded" if entry.downloaded else "Not downloaded",
            "hub": f"{entry.repo} · " + ("Downloaded" if entry.downloaded else "Not downloaded"),
            "cache": "In the Hugging Face cache",
            "folder": "Local folder",
        }[entry.source]
        if entry.problem:  # files in the cache that cannot be loaded yet
            where = f"{entry.repo} · " if entry.source == "hub" else ""
            where += f"Incomplete download: {entry.problem}"
        exact = entry.downloaded or entry.source == "hub"  # the Hub's own file sizes
        size = ("" if exact else "≈ ") + fmt_bytes(entry.size_bytes)
        self.meta = QLabel(f"{size} · {where}")
        self.meta.setObjectName("subtle")
        self.meta.setWordWrap(bool(entry.problem))
        layout.addWidget(self.meta)
        self.reason = QLabel()
        self.reason.setObjectName("reason")
        self.reason.setWordWrap(True)
        layout.addWidget(self.reason)
        self.set_decision(decision)

    def set_decision(self, decision: object) -> bool:
        """Show a verdict; returns whether anything changed (the row may change height)."""
        if decision is self.decision:
            return False
        self.decision = decision
        kind = verdict_kind(decision)
        self.badge.setText(verdict_label(decision))
        if self.badge.property("kind") != kind:
            self.badge.setProperty("kind", kind)
            restyle(self.badge)
        reason = str(getattr(decision, "reason", "") or "")
        tips = tuple(getattr(decision, "suggestions", ()) or ())
        if tips:  # what to change, as the load panel lists it
            reason = f"{reason.rstrip('.')}. To make it fit: {', or '.join(tips)}."
        self.reason.setText(reason)
        # CPU mode is said once by the gauge and the list's hint; the cards keep the badge.
        self.reason.setVisible(bool(reason) and kind not in ("good", "cpu", "unknown"))
        self.setToolTip(f"{self.entry.repo or self.entry.local_dir}\n{reason}".strip())
        return True


class LibraryPanel(QWidget):
    """Takes the Library, the DownloadManager and the FitAdvisor; `chosen` picks a model."""

    chosen = Signal(object)  # Entry
    connect_requested = Signal()  # "Connect to a server…": a model served elsewhere
    repo_checked = Signal(object, str)  # RepoInfo or None, and why not (from the probe thread)

    def __init__(
        self,
        library: Library,
        downloads: DownloadManager,
        advisor: FitAdvisor,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.library, self.downloads, self.advisor = library, downloads, advisor
        # Whether the engine is loading or has loaded a folder (the window sets it): its
        # files are not deleted from under it.
        self.in_use: Callable[[str], bool] = lambda _folder: False
        self.decisions: dict[str, object] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.setSpacing(8)
        self.hint = QLabel(HINT)
        self.hint.setObjectName("subtle")
        self.hint.setWordWrap(True)
        layout.addWidget(self.hint)
        self.list = QListWidget()
        self.list.setObjectName("libraryList")
        self.list.setSpacing(3)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemDoubleClicked.connect(lambda *_: self._use())
        # Rows as wide as the list, as tall as their cards at that width (`_fit_rows`): a
        # card's wrapped reason never makes every row wider than the list.
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.viewport().installEventFilter(self)
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
        self.add_repo_button = QPushButton("Add from Hugging Face…")
        self.add_repo_button.setToolTip(
            "Add another Qwen3.5 model (a fine-tune, another quantization) by its repository "
            "id: checked and planned before anything is downloaded"
        )
        self.add_repo_button.clicked.connect(self._ask_repo)
        self.repo_checked.connect(self._repo_checked)
        more = QHBoxLayout()
        more.addWidget(self.open_button)
        more.addWidget(self.add_repo_button)
        layout.addLayout(more)
        self.connect_button = QPushButton("Connect to a server…")
        self.connect_button.setToolTip(
            "Chat with a model that runs on an OpenAI-compatible server (another Snug, "
            "vLLM, llama.cpp, Ollama): for models larger than this GPU"
        )
        self.connect_button.clicked.connect(self.connect_requested)
        layout.addWidget(self.connect_button)

        library.changed.connect(self.refresh)
        advisor.changed.connect(self.update_verdicts)
        advisor.decided.connect(self.update_verdicts)
        downloads.started.connect(self._dl_started)
        downloads.progress.connect(self._dl_progress)
        downloads.finished.connect(self._dl_finished)
        downloads.failed.connect(self._dl_failed)
        downloads.cancelled.connect(self._dl_cancelled)
        self.refresh()

    # -- view
    def refresh(self) -> None:
        """Rebuild the rows (the library changed); verdicts come from the advisor's cache."""
        current = self.selected()
        self.list.clear()
        for entry in self.library.entries():
            item = QListWidgetItem()
            item.setData(Qt.ItemDataRole.UserRole, entry.key)
            card = EntryCard(entry, self.advisor.verdict(entry))
            self.decisions[entry.key] = card.decision
            self.list.addItem(item)
            self.list.setItemWidget(item, card)
            if current is not None and current.key == entry.key:
                self.list.setCurrentItem(item)
        self._fit_rows()
        if self.library.scan_error:
            self._say(f"Could not read the Hugging Face cache: {self.library.scan_error}")
        self._update_hint()
        self._update_buttons()

    def update_verdicts(self) -> None:
        """Put the advisor's current verdicts on the rows, without rebuilding them."""
        for i in range(self.list.count()):
            item = self.list.item(i)
            card = self.list.itemWidget(item)
            if card is None:
                continue
            decision = self.advisor.verdict(card.entry)
            self.decisions[card.entry.key] = decision
            if card.set_decision(decision):
                self._fit_row(item, card)
        self._update_hint()

    def _fit_row(self, item: QListWidgetItem, card: QWidget) -> None:
        """The row as wide as the list and as tall as its card is at that width: the width
        is given, not left to the list, which stretches a row to its width but never
        narrows one again (a narrower window, or a scroll bar coming in)."""
        width = max(1, self.list.viewport().width() - 2 * self.list.spacing())
        height = card.heightForWidth(width) if card.hasHeightForWidth() else -1
        hint = QSize(width, max(height, card.minimumSizeHint().height()))
        if item.sizeHint() != hint:
            item.setSizeHint(hint)

    def _fit_rows(self) -> None:
        for i in range(self.list.count()):
            card = self.list.itemWidget(self.list.item(i))
            if card is not None:
                self._fit_row(self.list.item(i), card)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if watched is self.list.viewport() and event.type() == QEvent.Type.Resize:
            self._fit_rows()  # a narrower list wraps the reasons on more lines
        return super().eventFilter(watched, event)

    def _update_hint(self) -> None:
        if self.advisor.on_cpu() and self.advisor.machine.no_gpu:
            ram = host_fit.gib(self.advisor.machine.ram_available())
            self.hint.setText(CPU_HINT.format(ram=ram, context=self.advisor.settings.context))
        else:
            self.hint.setText(HINT)

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
                restyle(card)
        if self.downloads.active is None and not self.library.scan_error:
            self._say("")  # an error about the model selected before is stale now
        self._update_buttons()

    def _update_buttons(self) -> None:
        entry = self.selected()
        busy = self.downloads.active is not None
        self.use_button.setEnabled(entry is not None and entry.downloaded)
        self.download_button.setEnabled(
            entry is not None and not entry.downloaded and entry.repo is not None and not busy
        )
        self.cancel_button.setEnabled(busy)
        listed = entry is not None and entry.source == "hub" and not entry.downloaded
        partial = _partial(entry) and self.downloads.active != entry.repo
        self.delete_button.setEnabled(entry is not None and (entry.downloaded or listed or partial))
        folder = entry is not None and entry.source == "folder"
        self.delete_button.setText(
            "Remove from list" if (folder or listed) and not partial else "Delete"
        )
        self.delete_button.setToolTip(
            "Delete the unfinished download's files from the Hugging Face cache"
            if partial
            else "Take this folder off the list (the files stay on disk)"
            if folder
            else "Take this repository off the list"
            if listed
            else "Delete this model's files from the Hugging Face cache"
        )

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
        partial = _partial(entry)
        if partial and self.downloads.active == entry.repo:
            return  # its download is under way: Cancel first (Delete is disabled meanwhile)
        if entry.source == "hub" and not entry.downloaded and not partial:
            self._say(self.library.delete(entry))  # nothing on disk to ask about
            return
        if entry.source != "folder" and not partial and self.in_use(entry.local_dir):
            self._say(
                f"{entry.title} is loaded or loading, so its files stay: Unload it first "
                "(the Unload or Cancel button under the model), then delete it."
            )
            return
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        if partial:
            box.setWindowTitle("Delete download")
            box.setText(f"Delete the unfinished download of {entry.title} from disk?")
            box.setInformativeText(
                "Its files and the parts downloaded so far are removed from the Hugging Face "
                "cache; Download then starts it again from the beginning."
            )
            yes = box.addButton("Delete from disk", QMessageBox.ButtonRole.DestructiveRole)
        elif entry.source == "folder":
            box.setWindowTitle("Remove from the list")
            box.setText(f"Remove {entry.title} from the list?")
            box.setInformativeText(f"The folder stays on disk: {entry.local_dir}")
            yes = box.addButton("Remove from the list", QMessageBox.ButtonRole.AcceptRole)
        else:
            box.setWindowTitle("Delete model")
            box.setText(f"Delete {entry.title} ({fmt_bytes(entry.size_bytes)}) from disk?")
            box.setInformativeText(
                f"Its files are removed from the Hugging Face cache: {entry.local_dir}"
            )
            yes = box.addButton("Delete from disk", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setObjectName("confirmDelete")
        box.exec()
        if box.clickedButton() is yes:
            self._say(self.library.delete(entry))

    def _open_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a model folder")
        if folder:
            self.add_folder(folder)

    def _ask_repo(self) -> None:
        text, ok = QInputDialog.getText(
            self, "Add from Hugging Face", "Repository id (owner/name) or its address:"
        )
        if ok and text.strip():
            self.add_repo(text)

    def add_repo(self, text: str) -> None:
        """Check the repository `text` names on the Hub (on a thread: its listing and its
        config.json), then list it with its verdict; says why in the panel when it cannot."""
        self.add_repo_button.setEnabled(False)
        self._say("")
        self.progress_label.setText(f"Checking {text.strip()} on the Hugging Face Hub…")
        self.progress_label.show()
        endpoint = self.downloads.endpoint

        def ask() -> None:
            try:
                info, error = probe_repo(text, endpoint), ""
            except RepoRefused as exc:
                info, error = None, str(exc)
            try:
                self.repo_checked.emit(info, error)
            except RuntimeError:  # the window closed meanwhile
                pass

        threading.Thread(target=ask, name="snug-hub-probe", daemon=True).start()

    def _repo_checked(self, info: RepoInfo | None, error: str) -> None:
        self.add_repo_button.setEnabled(True)
        self.progress_label.hide()
        if info is None:
            self._say(error)
            return
        entry = self.library.add_repo(info.repo, info.config, info.weight_bytes)
        self.select(entry.key)
        done = (
            "on disk already" if entry.downloaded else f"{fmt_bytes(entry.size_bytes)} to download"
        )
        self.progress_label.setText(f"{entry.title} added ({done}).")
        self.progress_label.show()

    def add_folder(self, folder: str) -> Entry | None:
        """Add a local model folder; says why in the panel when it is not one."""
        try:
            entry = self.library.add_folder(folder)
        except FolderRefused as exc:
            self._say(str(exc))
            return None
        self.select(entry.key)
        self._say("")
        return entry

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
