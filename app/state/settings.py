"""Typed application settings stored in QSettings (organisation "Snug", application "Snug")."""

from __future__ import annotations

from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, QSettings, Signal

from engine.config import GIB, EngineSettings


@dataclass(frozen=True)
class Field:
    key: str
    kind: type
    default: object
    label: str
    needs_reload: bool = False


FIELDS: tuple[Field, ...] = (
    Field("memory/reserve_gib", float, 0.5, "Memory reserve (GiB)", True),
    Field("memory/limit_gib", float, 0.0, "Memory limit (GiB, 0 = none)", True),
    Field("engine/context", int, 8192, "Context length (tokens)", True),
    Field("engine/max_rows", int, 512, "Max rows per forward", True),
    Field("engine/streams", int, 1, "Streams", True),
    Field("engine/backend", str, "auto", "Backend", True),
    Field("engine/refuse_cpu", bool, False, "Refuse CPU mode", True),
    Field("sampling/temperature", float, 0.7, "Temperature"),
    Field("sampling/top_p", float, 0.8, "Top-p"),
    Field("sampling/top_k", int, 20, "Top-k"),
    Field("sampling/presence_penalty", float, 1.5, "Presence penalty"),
    Field("sampling/min_p", float, 0.0, "Min-p"),
    Field("sampling/max_new_tokens", int, 2048, "Max new tokens"),
    Field("chat/thinking", bool, False, "Thinking"),
    Field("chat/system_prompt", str, "You are a helpful assistant.", "System prompt"),
    Field("model/last_dir", str, "", "Last model folder"),
)
BY_KEY = {f.key: f for f in FIELDS}
# The engine's names (SNUG_BACKEND); the settings panel shows each with its own label.
BACKENDS = ("auto", "cuda", "numpy")
BACKEND_ALIASES = {"cpu": "numpy"}  # the name settings files written before used


def _coerce(field: Field, raw: object) -> object:
    if raw is None:
        return field.default
    try:
        if field.kind is bool:
            if isinstance(raw, str):
                return raw.strip().lower() in ("1", "true", "yes", "on")
            return bool(raw)
        return field.kind(raw)
    except (TypeError, ValueError):
        return field.default


class AppSettings(QObject):
    """Typed access to QSettings; emits `changed(key, value)` on every write.

    Pass a QSettings to use another store (tests use an ini file in a temp folder).
    """

    changed = Signal(str, object)

    def __init__(self, store: QSettings | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._store = store if store is not None else QSettings("Snug", "Snug")

    @property
    def store(self) -> QSettings:
        return self._store

    def get(self, key: str) -> object:
        field = BY_KEY[key]
        return _coerce(field, self._store.value(key, field.default))

    def set(self, key: str, value: object) -> None:
        field = BY_KEY[key]
        value = _coerce(field, value)
        if value == self.get(key) and self._store.contains(key):
            return
        self._store.setValue(key, value)
        self._store.sync()
        self.changed.emit(key, value)

    def reset(self) -> None:
        for field in FIELDS:
            if field.key != "model/last_dir":
                self.set(field.key, field.default)

    @staticmethod
    def needs_reload(key: str) -> bool:
        return BY_KEY[key].needs_reload

    # Typed shortcuts for the values read most often.
    @property
    def context(self) -> int:
        return int(self.get("engine/context"))

    @property
    def streams(self) -> int:
        return int(self.get("engine/streams"))

    @property
    def max_rows(self) -> int:
        return int(self.get("engine/max_rows"))

    @property
    def backend(self) -> str:
        """auto, cuda or numpy (the engine's names); an old file's "cpu" reads as numpy."""
        value = str(self.get("engine/backend"))
        value = BACKEND_ALIASES.get(value, value)
        return value if value in BACKENDS else "auto"

    @property
    def refuse_cpu(self) -> bool:
        return bool(self.get("engine/refuse_cpu"))

    @property
    def thinking(self) -> bool:
        return bool(self.get("chat/thinking"))

    @property
    def system_prompt(self) -> str:
        return str(self.get("chat/system_prompt"))

    def engine_settings(self) -> EngineSettings:
        """EngineSettings from the environment, with the fields these settings own replaced.

        Reserve, limit and backend come from here; everything else the environment sets
        (SNUG_COMPUTE_DTYPE, SNUG_OVERLAP_LAUNCHES, SNUG_CACHE_DIR...) passes through.
        """
        reserve = float(self.get("memory/reserve_gib"))
        limit = float(self.get("memory/limit_gib"))
        return replace(
            EngineSettings.from_env(),
            reserve_bytes=int(round(reserve * GIB)),
            limit_bytes=int(round(limit * GIB)) if limit > 0 else None,
            backend=self.backend,
        )

    def sampling(self) -> dict[str, float | int]:
        return {
            "temperature": float(self.get("sampling/temperature")),
            "top_p": float(self.get("sampling/top_p")),
            "top_k": int(self.get("sampling/top_k")),
            "presence_penalty": float(self.get("sampling/presence_penalty")),
            "min_p": float(self.get("sampling/min_p")),
            "max_new_tokens": int(self.get("sampling/max_new_tokens")),
        }
