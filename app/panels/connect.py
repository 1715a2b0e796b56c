"""Connect to a model on a server: URL, API key, and a model listed from /v1/models.

On Connect the dialog emits `target_chosen(RemoteTarget)`; whoever opened it loads that
target (`RemoteLoader.request_for(target)` handed to `EngineController.load`). Listing runs
on a short-lived thread, so a slow server never freezes the window.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Signal
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

Lister = Callable[[str, str], list[dict[str, Any]]]


class ConnectDialog(QDialog):
    target_chosen = Signal(object)  # RemoteTarget
    models_listed = Signal(list, str)  # models, error ("" when none); from the lister thread

    def __init__(
        self,
        parent: QWidget | None = None,
        url: str = DEFAULT_URL,
        api_key: str = "",
        lister: Lister = list_models,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        self._lister = lister
        self._contexts: dict[str, int | None] = {}
        self.url = QLineEdit(url)
        self.url.setPlaceholderText(DEFAULT_URL)
        self.api_key = QLineEdit(api_key)
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none")
        self.model = QComboBox()
        self.model.setEditable(True)
        self.list_button = QPushButton("List models")
        self.status = QLabel("Any OpenAI-compatible server: snug serve, llama.cpp, vLLM...")
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
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Connect")
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self.list_button.clicked.connect(self.refresh)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.models_listed.connect(self._show_models)

    def refresh(self) -> None:
        """List the server's models (on a thread; `models_listed` brings them back)."""
        url, key = self.url.text().strip() or DEFAULT_URL, self.api_key.text().strip()
        self.list_button.setEnabled(False)
        self.status.setText(f"Asking {url} for its models...")

        def ask() -> None:
            try:
                self.models_listed.emit(self._lister(url, key), "")
            except Exception as exc:  # every failure becomes a line in the dialog
                self.models_listed.emit([], str(exc))

        threading.Thread(target=ask, name="snug-list-models", daemon=True).start()

    def _show_models(self, models: list, error: str) -> None:
        self.list_button.setEnabled(True)
        if error:
            self.status.setText(error)
            return
        self._contexts = {m["id"]: m.get("context") for m in models}
        self.model.clear()
        self.model.addItems([m["id"] for m in models])
        self.status.setText(f"{len(models)} model(s) on this server.")

    def target(self) -> RemoteTarget:
        name = self.model.currentText().strip()
        return RemoteTarget(
            url=self.url.text().strip() or DEFAULT_URL,
            api_key=self.api_key.text().strip(),
            model=name,
            context=self._contexts.get(name),
        )

    def accept(self) -> None:
        self.target_chosen.emit(self.target())
        super().accept()
