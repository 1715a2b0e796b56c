"""Connect to a model on a server: URL, API key, and a model listed from /v1/models.

Connect first asks the server for its models (as List models does): only once it has
answered is `target_chosen(RemoteTarget)` emitted and the dialog closed, with the model
named (the first chat model listed where none was) and the address made the API's base
(`localhost:11434` -> `http://localhost:11434/v1`). A failure is said on the dialog's status
line and everything typed stays. Whoever opened it loads the target
(`RemoteLoader.request_for(target)` handed to `EngineController.load`). The server is asked
on a short-lived thread, so a slow server never freezes the window.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.remote_engine import DEFAULT_URL, RemoteTarget, list_models
from app.remote_wire import WHERE, base_url, pick_model, public

Lister = Callable[[str, str], list[dict[str, Any]]]
HINT = "Any OpenAI-compatible server: snug serve, Ollama, llama.cpp, vLLM, LM Studio..."


class ConnectDialog(QDialog):
    target_chosen = Signal(object)  # RemoteTarget
    models_listed = Signal(list, str)  # models, error ("" when none), once they are shown
    _answered = Signal(int, list, str)  # ask number, models, error; from the asking thread

    def __init__(
        self,
        parent: QWidget | None = None,
        url: str = DEFAULT_URL,
        api_key: str = "",
        lister: Lister = list_models,
        model: str = "",
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        self._lister = lister
        self._contexts: dict[str, int | None] = {}
        self._asked = 0  # the latest ask's number: an older answer is not shown
        self._connecting = False  # the latest ask is Connect's (else List models')
        self.url = QLineEdit(url)
        self.url.setPlaceholderText(DEFAULT_URL)
        self.api_key = QLineEdit(api_key)
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none")
        self.model = QComboBox()
        self.model.setEditable(True)
        # A long model id (hf.co/org/repo:quant) scrolls in the box, not widens the dialog.
        self.model.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.model.setMinimumContentsLength(24)
        self.model.setEditText(model)
        self.model.lineEdit().setPlaceholderText("the first one listed")
        self.list_button = QPushButton("List models")
        self.status = QLabel(HINT)
        self.status.setWordWrap(True)
        row = QHBoxLayout()
        row.addWidget(self.model, 1)
        row.addWidget(self.list_button)
        form = QFormLayout()
        form.addRow("Server URL", self.url)
        form.addRow("API key", self.api_key)
        form.addRow("Model", row)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.connect_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.connect_button.setText("Connect")
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.list_button.clicked.connect(self.refresh)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self._answered.connect(self._show_models)

    def refresh(self) -> None:
        """List the server's models (on a thread; `models_listed` says when they show)."""
        self._ask(connecting=False)

    def accept(self) -> None:
        """Connect: ask the server first; the dialog closes once it has answered."""
        self._ask(connecting=True)

    def reject(self) -> None:
        self._asked += 1  # an answer still to come is for nobody now
        self._busy(False)
        super().reject()

    def _ask(self, connecting: bool) -> None:
        url, key = base_url(self.url.text()), self.api_key.text().strip()
        self._asked += 1
        self._connecting = connecting
        asked = self._asked
        self._busy(True)
        self._say(f"{'Connecting to' if connecting else 'Asking'} {public(url)}…")

        def ask() -> None:
            try:
                models, error = self._lister(url, key), ""
            except Exception as exc:  # every failure becomes a line in the dialog
                models, error = [], str(exc) or type(exc).__name__
            try:
                self._answered.emit(asked, models, error)
            except RuntimeError:  # the dialog is gone: nobody waits for the answer
                pass

        threading.Thread(target=ask, name="snug-list-models", daemon=True).start()

    def _busy(self, busy: bool) -> None:
        """While the server is asked, the address and key asked with stay as they are."""
        self.list_button.setEnabled(not busy)
        self.connect_button.setEnabled(not busy)
        self.url.setReadOnly(busy)
        self.api_key.setReadOnly(busy)

    def _show_models(self, asked: int, models: list, error: str) -> None:
        if asked != self._asked:
            return
        self._busy(False)
        if error:
            self._say(error)
            self.models_listed.emit([], error)
            return
        url = base_url(self.url.text())
        self.url.setText(url)
        typed = self.model.currentText().strip()
        ids = [m["id"] for m in models]
        self._contexts = {m["id"]: m.get("context") for m in models}
        self.model.clear()
        self.model.addItems(ids)
        for i, name in enumerate(ids):
            self.model.setItemData(i, name, Qt.ItemDataRole.ToolTipRole)  # the whole id
        self.model.setEditText(typed or pick_model(models))
        if not models and not typed:
            self._say(
                f"The server at {public(url)} lists no models: load or pull one there first (as "
                "`ollama pull NAME`), then List models again."
            )
        elif self._connecting:
            self.target_chosen.emit(self.target())
            self._say(HINT)
            super().accept()
        elif typed and typed not in ids:
            self._say(f"{len(ids)} model(s) on this server; “{typed}” is not one.")
        else:
            self._say(f"{len(ids)} model(s) on this server.")
        self.models_listed.emit(models, "")

    def _say(self, text: str) -> None:
        """Show `text` on the status line, the dialog growing to fit it (a long message must
        not squeeze the fields above it). Said here, a message needs no "in Connect to a
        server…" pointing back at this dialog; it starts as a sentence."""
        text = text.replace(f" {WHERE}", "")
        self.status.setText(text[:1].upper() + text[1:])
        layout = self.layout()
        layout.activate()
        need = layout.totalHeightForWidth(self.width()) if layout.hasHeightForWidth() else 0
        if need > self.height():
            self.resize(self.width(), need)

    def target(self) -> RemoteTarget:
        name = self.model.currentText().strip()
        return RemoteTarget(
            url=base_url(self.url.text()),
            api_key=self.api_key.text().strip(),
            model=name,
            context=self._contexts.get(name),
        )
