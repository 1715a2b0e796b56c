"""A chat's own system prompt: the dialog behind the chat title's "System prompt" button."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)


class SystemPromptDialog(QDialog):
    """Edits one chat's system prompt. "Use the default" leaves the chat to the one in
    Settings > Chat (`prompt()` is then None); an empty prompt of the chat's own means
    none at all."""

    def __init__(self, own: str | None, default: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("systemPromptDialog")
        self.setWindowTitle("System prompt of this chat")
        self.setMinimumWidth(460)
        self.default = default
        # The chat's own prompt, as last typed: the box shows the default while "Use the
        # default" is ticked, and this again once it is unticked (the default where the
        # chat had none, as a start to change).
        self._own = default if own is None else own
        layout = QVBoxLayout(self)
        note = QLabel(
            "What the model is told before the conversation, in this chat only. The "
            "prompt in Settings > Chat is for every chat that has none of its own."
        )
        note.setWordWrap(True)
        note.setObjectName("subtle")
        layout.addWidget(note)
        self.use_default = QCheckBox("Use the default (Settings > Chat)")
        self.use_default.setChecked(own is None)
        self.use_default.toggled.connect(self._toggled)
        layout.addWidget(self.use_default)
        self.edit = QPlainTextEdit(default if own is None else own)
        self.edit.setObjectName("systemPromptEdit")
        self.edit.setPlaceholderText("No system prompt")
        self.edit.setMinimumHeight(120)
        layout.addWidget(self.edit)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self._toggled(own is None)

    def _toggled(self, default: bool) -> None:
        if default and not self.edit.isReadOnly():
            self._own = self.edit.toPlainText()  # what was typed, kept for an untick
        self.edit.setReadOnly(default)
        self.edit.setEnabled(not default)
        self.edit.setPlainText(self.default if default else self._own)

    def prompt(self) -> str | None:
        """The chat's own prompt as edited, or None to use the default."""
        return None if self.use_default.isChecked() else self.edit.toPlainText().strip()
