"""Settings panel: every field of AppSettings, saved as it changes."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.controllers import EngineController
from app.server_controller import ServerController
from app.state.settings import BACKENDS, BY_KEY, SAMPLING_KNOBS, AppSettings
from app.theme import THEMES
from app.widgets.number_box import DecimalBox, IntBox
from engine.config import DRAFT_CHOICES, KV_CACHES

# Bounds the engine accepts (engine.sampling.SamplingParams.__post_init__): top_p in (0, 1],
# min_p in [0, 1), temperature and top_k >= 0. A spin box cannot hold an open bound, so
# top_p starts at its smallest step and min_p ends one step short of 1.
RANGES = {
    "memory/reserve_gib": (0.0, 64.0, 0.25, 2),
    "memory/limit_gib": (0.0, 1024.0, 0.5, 2),
    "engine/context": (256, 262144, 1024, 0),
    "engine/max_rows": (0, 8192, 64, 0),
    "engine/streams": (1, 16, 1, 0),
    "sampling/temperature": (0.0, 2.0, 0.05, 2),
    "sampling/top_p": (0.01, 1.0, 0.05, 2),
    "sampling/top_k": (0, 1000, 1, 0),
    "sampling/presence_penalty": (0.0, 2.0, 0.1, 2),
    "sampling/min_p": (0.0, 0.99, 0.01, 2),
    "sampling/max_new_tokens": (16, 32768, 256, 0),
    "chat/thinking_budget": (0, 32768, 256, 0),
    "server/port": (1024, 65535, 1, 0),
    "app/chat_text_size": (6, 32, 1, 0),
    "cache/host_gib": (0.0, 256.0, 0.5, 1),
    "cache/disk_gib": (0.0, 4096.0, 1.0, 1),
}
# The set for replies that think first takes the same boxes (app/state/settings.py).
THINKING_KEYS = tuple(f"thinking_sampling/{name}" for name, *_ in SAMPLING_KNOBS)
RANGES |= {key: RANGES[key.removeprefix("thinking_")] for key in THINKING_KEYS}
# What a spin box shows at its minimum, where the minimum means "the engine chooses".
AT_MINIMUM = {"engine/max_rows": "Auto", "chat/thinking_budget": "No limit"}
BACKEND_LABELS = {"auto": "Auto", "cuda": "GPU (CUDA)", "numpy": "CPU (numpy)"}
KV_CACHE_LABELS = {"bf16": "16-bit (bf16)", "int8": "8-bit (longer context)"}
DRAFT_LABELS = {
    "off": "Off",
    "1": "1 token a step",
    "2": "2 tokens a step",
    "3": "3 tokens a step",
    "auto": "Auto (by acceptance)",
}
THEME_LABELS = {"system": "As the system", "light": "Light", "dark": "Dark"}
# The settings edited with a list: key -> (values, label of each).
CHOICES = {
    "app/theme": (THEMES, THEME_LABELS),
    "engine/backend": (BACKENDS, BACKEND_LABELS),
    "engine/kv_cache": (KV_CACHES, KV_CACHE_LABELS),
    "engine/draft_tokens": (DRAFT_CHOICES, DRAFT_LABELS),
}
GROUPS = (
    ("Memory", ("memory/reserve_gib", "memory/limit_gib")),
    (
        "Engine",
        (
            "engine/backend",
            "engine/refuse_cpu",
            "engine/kv_cache",
            "engine/draft_tokens",
            "engine/context",
            "engine/max_rows",
            "engine/streams",
        ),
    ),
    (
        "Sampling",
        (
            "sampling/temperature",
            "sampling/top_p",
            "sampling/top_k",
            "sampling/presence_penalty",
            "sampling/min_p",
            "sampling/max_new_tokens",
        ),
    ),
    ("Sampling while thinking", THINKING_KEYS),
    ("Chat", ("chat/thinking", "chat/thinking_budget", "chat/system_prompt")),
    ("App", ("app/theme", "app/chat_text_size", "app/load_last_model")),
    ("Local server", ("server/enabled", "server/port")),
    ("Saved conversations", ("cache/host_gib", "cache/disk_gib")),
)


class SettingsPanel(QScrollArea):
    """Edits AppSettings; a banner says when a change applies only after a reload."""

    def __init__(
        self,
        settings: AppSettings,
        engine: EngineController | None = None,
        parent: QWidget | None = None,
        server: ServerController | None = None,
    ) -> None:
        super().__init__(parent)
        self.settings, self.engine = settings, engine
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setObjectName("settingsPanel")
        body = QWidget()
        layout = QVBoxLayout(body)
        layout.setContentsMargins(12, 12, 12, 12)
        layout.setSpacing(10)
        self.reload_note = QLabel()
        self.reload_note.setObjectName("reloadNote")
        self.reload_note.setWordWrap(True)
        self.reload_note.hide()
        layout.addWidget(self.reload_note)
        self.editors: dict[str, QWidget] = {}
        for title, keys in GROUPS:
            box = QGroupBox(title)
            form = QFormLayout(box)
            form.setHorizontalSpacing(12)
            # A label too long for the column puts its field on the next line, so the panel
            # fits its column (380 px at least) without scrolling sideways.
            form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
            for key in keys:
                editor = self._editor(key)
                self.editors[key] = editor
                label = BY_KEY[key].label + (" ⟳" if settings.needs_reload(key) else "")
                form.addRow(label, editor)
            layout.addWidget(box)
        self.server_status = QLabel("Not serving")
        self.server_status.setObjectName("subtle")
        self.server_status.setWordWrap(True)
        self.server_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.server_status)
        if server is not None:
            server.url_changed.connect(self._server_url)
            server.failed.connect(lambda msg: self.server_status.setText(f"Not serving: {msg}"))
        hint = QLabel("⟳ applies when the model is loaded again.")
        hint.setObjectName("subtle")
        layout.addWidget(hint)
        self.reset_button = QPushButton("Restore defaults")
        self.reset_button.clicked.connect(self.restore_defaults)
        layout.addWidget(self.reset_button)
        layout.addStretch(1)
        self.setWidget(body)
        self._pending: list[str] = []
        settings.changed.connect(self._changed)
        if engine is not None:
            engine.loaded.connect(self._clear_pending)
            engine.unloaded.connect(self._clear_pending)

    def restore_defaults(self) -> bool:
        """Every setting back to its default, once the user says so (the system prompt
        written here goes too); True if restored."""
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Restore defaults")
        box.setText("Put every setting back to its default?")
        box.setInformativeText(
            "Memory, engine, sampling, chat (the system prompt too), appearance and server "
            "settings all go back; chats and models stay."
        )
        yes = box.addButton("Restore defaults", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        if box.clickedButton() is not yes:
            return False
        self.settings.reset()
        return True

    def _server_url(self, url: str) -> None:
        self.server_status.setText(
            f"Serving the loaded model at {url} (OpenAI API)" if url else "Not serving"
        )

    def _editor(self, key: str) -> QWidget:
        field, s = BY_KEY[key], self.settings
        value = s.get(key)
        if key in CHOICES:
            values, labels = CHOICES[key]
            combo = QComboBox()
            for name in values:
                combo.addItem(labels[name], name)
            combo.setCurrentIndex(values.index(self._choice(key)))
            combo.currentIndexChanged.connect(lambda i: s.set(key, values[i]))
            return combo
        if field.kind is bool:
            box = QCheckBox()
            box.setChecked(bool(value))
            box.toggled.connect(lambda v: s.set(key, v))
            return box
        if key == "chat/system_prompt":
            edit = QPlainTextEdit(str(value))
            edit.setFixedHeight(70)
            edit.textChanged.connect(lambda: s.set(key, edit.toPlainText()))
            return edit
        lo, hi, step, decimals = RANGES[key]
        spin: IntBox | DecimalBox = IntBox() if field.kind is int else DecimalBox()
        if isinstance(spin, DecimalBox):
            spin.setDecimals(decimals)
        spin.setRange(lo, hi)
        spin.setSingleStep(step)
        spin.setSpecialValueText(AT_MINIMUM.get(key, ""))
        # Typed text below the minimum ("0" in top-p) becomes the minimum; a box left empty
        # goes back to its value from before the edit (app/widgets/number_box.py).
        _show_number(spin, key, value)
        # Connected once it shows the stored value: building the panel writes no setting.
        if isinstance(spin, DecimalBox):
            spin.valueChanged.connect(lambda v: s.set(key, round(v, decimals)))
        else:
            spin.valueChanged.connect(lambda v: s.set(key, v))
        return spin

    def _choice(self, key: str) -> str:
        """The value a list setting shows (the backend as the engine names it)."""
        return self.settings.backend if key == "engine/backend" else str(self.settings.get(key))

    def _changed(self, key: str, value: object) -> None:
        editor = self.editors.get(key)
        if editor is not None:
            editor.blockSignals(True)
            if isinstance(editor, QCheckBox):
                editor.setChecked(bool(value))
            elif isinstance(editor, QComboBox):
                editor.setCurrentIndex(CHOICES[key][0].index(self._choice(key)))
            elif isinstance(editor, QPlainTextEdit):
                if editor.toPlainText() != value:
                    editor.setPlainText(str(value))
            elif not _same_number(editor, value):
                # Only from elsewhere (Restore defaults, the Load tab): the box being typed in
                # already holds this value, and setting it again would rewrite its text
                # mid-edit ("1." becomes "1.00", so "1.25" could never be typed).
                _show_number(editor, key, value)
            editor.blockSignals(False)
        loaded = self.engine is not None and self.engine.state in ("ready", "generating")
        if self.settings.needs_reload(key) and loaded and key not in self._pending:
            self._pending.append(key)
        self._show_pending()

    def _clear_pending(self, *_args: object) -> None:
        self._pending = []
        self._show_pending()

    def _show_pending(self) -> None:
        names = ", ".join(BY_KEY[k].label.split(" (")[0].lower() for k in self._pending)
        self.reload_note.setText(f"Reload the model to apply: {names}." if names else "")
        self.reload_note.setVisible(bool(names))

    def pending_reload(self) -> list[str]:
        return list(self._pending)


def _show_number(spin: QSpinBox | QDoubleSpinBox, key: str, value: object) -> None:
    """`value` in the box, its usual range (RANGES) widened as far as the value needs: a
    value the setting holds and the usual range leaves out (a context or streams set in the
    Load tab, a value an older version saved) is shown as it is, never cut to the range and
    saved cut."""
    lo, hi = RANGES[key][:2]
    number = float(value) if isinstance(spin, QDoubleSpinBox) else int(value)
    spin.setRange(min(lo, number), max(hi, number))
    spin.setValue(number)


def _same_number(editor: QWidget, value: object) -> bool:
    """Whether a spin box already shows `value` (to its decimals)."""
    if isinstance(editor, QDoubleSpinBox):
        return round(editor.value(), editor.decimals()) == round(float(value), editor.decimals())
    return isinstance(editor, QSpinBox) and editor.value() == int(value)
