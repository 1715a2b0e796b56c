"""Typed application settings stored in QSettings (organisation "Snug", application "Snug").

Every value read from the store is parsed and range-checked (`parse`); a value that is not
valid falls back to its default with a warning that names the key, the value and the
default. The warnings, and those for SNUG_* environment variables the engine refuses, are
kept in `AppSettings.problems` for the window to show; none of them stops the app.
"""

from __future__ import annotations

import logging
import math
import os
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, QSettings, Signal

from app.theme import THEMES
from engine.config import (
    DRAFT_CHOICES,
    GIB,
    KV_CACHES,
    MAX_GIB,
    EngineSettings,
    default_prompt_cache_dir,
)
from engine.errors import ConfigError
from engine.sampling import RECOMMENDED

log = logging.getLogger(__name__)


class SettingError(ValueError):
    """A value that a setting cannot hold; the message says why."""


@dataclass(frozen=True)
class Field:
    key: str
    kind: type
    default: object
    label: str
    needs_reload: bool = False
    lo: float | None = None  # numbers: the valid range, inclusive
    hi: float | None = None
    choices: tuple[str, ...] = ()  # text: the values allowed (empty: any text)


# The engine's names (SNUG_BACKEND); the settings panel shows each with its own label.
BACKENDS = ("auto", "cuda", "numpy")
BACKEND_ALIASES = {"cpu": "numpy"}  # the name settings files written before used

# The settings of each sampling set: the engine's name (GenerationParams), type, label and
# range.
SAMPLING_KNOBS = (
    ("temperature", float, "Temperature", 0, 100),
    ("top_p", float, "Top-p", 0, 1),
    ("top_k", int, "Top-k", 0, 1 << 24),
    ("presence_penalty", float, "Presence penalty", -100, 100),
    ("min_p", float, "Min-p", 0, 1),
)

FIELDS: tuple[Field, ...] = (
    Field("memory/reserve_gib", float, 0.5, "Memory reserve (GiB)", True, 0, 1024),
    Field("memory/limit_gib", float, 0.0, "Memory limit (GiB, 0 = none)", True, 0, MAX_GIB),
    Field("engine/context", int, 8192, "Context length (tokens)", True, 1, 1 << 24),
    Field("engine/max_rows", int, 0, "Max rows per forward (0 = auto)", True, 0, 1 << 16),
    Field("engine/streams", int, 1, "Streams", True, 1, 1024),
    Field(
        "engine/backend", str, "auto", "Backend", True, choices=BACKENDS + tuple(BACKEND_ALIASES)
    ),
    Field("engine/refuse_cpu", bool, False, "Refuse CPU mode", True),
    # The KV cache in the compute dtype, or 8-bit (about half the bytes: a longer context).
    Field("engine/kv_cache", str, "bf16", "KV cache", True, choices=KV_CACHES),
    # Tokens drafted a step with the checkpoint's MTP head (Hugging Face checkpoints only).
    Field("engine/draft_tokens", str, "off", "Drafting", True, choices=DRAFT_CHOICES),
    # Two sets, as Qwen3.5's model cards recommend one for replies without thinking and
    # another for replies that think first (engine.sampling.RECOMMENDED; `sampling()`).
    *(
        Field(f"{group}/{name}", kind, RECOMMENDED[thinking][name], label, lo=lo, hi=hi)
        for thinking, group in ((False, "sampling"), (True, "thinking_sampling"))
        for name, kind, label, lo, hi in SAMPLING_KNOBS
    ),
    Field("sampling/max_new_tokens", int, 2048, "Max new tokens", lo=1, hi=1 << 24),
    Field("chat/thinking", bool, False, "Thinking"),
    # The most tokens a reply thinks before it answers (0: no limit; engine/thinking_budget.py).
    Field("chat/thinking_budget", int, 0, "Thinking budget (tokens)", lo=0, hi=1 << 24),
    Field("chat/system_prompt", str, "You are a helpful assistant.", "System prompt"),
    Field("app/theme", str, "system", "Appearance", choices=THEMES),  # app/theme.py
    # The messages' and the message box's text (Ctrl+plus, Ctrl+minus; Ctrl+0: back to 10).
    Field("app/chat_text_size", int, 10, "Chat text size (pt)", lo=6, hi=32),
    # The model loaded when Snug last closed is loaded again at start (app/main_window.py).
    Field("app/load_last_model", bool, True, "Load the last model at start"),
    Field("model/last_dir", str, "", "Last model folder"),
    # Serve the loaded model over the OpenAI API on this machine (engine/server): the chat
    # and the server's clients then share one scheduler, set up when the model loads.
    Field("server/enabled", bool, False, "Serve the model (OpenAI API)", True),
    Field("server/port", int, 8000, "Server port", True, 1024, 65535),
    # Saved conversation states below the card's (engine.prompt_cache): in host memory, and
    # on disk in the app's data folder (prompt-cache/), so a chat resumes after a restart.
    Field("cache/host_gib", float, 2.0, "Prompt cache in memory (GiB, 0 = off)", True, 0, MAX_GIB),
    Field("cache/disk_gib", float, 8.0, "Prompt cache on disk (GiB, 0 = off)", True, 0, MAX_GIB),
)
BY_KEY = {f.key: f for f in FIELDS}
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


def parse(field: Field, raw: object) -> object:
    """The value `raw` (from the store or a widget) stands for; SettingError if none."""
    if field.kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        word = raw.strip().lower() if isinstance(raw, str) else None
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise SettingError("not true or false")
    if field.kind is str:
        if not isinstance(raw, str):
            raise SettingError("not text")
        if field.choices and raw not in field.choices:
            raise SettingError(f"not one of {', '.join(field.choices)}")
        return raw
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise SettingError("not a number")
    try:
        value = field.kind(raw.strip() if isinstance(raw, str) else raw)
    except (ValueError, OverflowError):
        raise SettingError(
            "not a number" if field.kind is float else "not a whole number"
        ) from None
    if field.kind is int and isinstance(raw, float) and value != raw:
        raise SettingError("not a whole number")
    if isinstance(value, float) and not math.isfinite(value):
        raise SettingError("not a finite number")
    if (field.lo is not None and value < field.lo) or (field.hi is not None and value > field.hi):
        raise SettingError(f"outside {field.lo:g}..{field.hi:g}")
    return value


def env_settings(environ: Mapping[str, str]) -> tuple[EngineSettings, list[str]]:
    """EngineSettings.from_env, with every SNUG_* variable it refuses named and left out."""
    try:
        return EngineSettings.from_env(environ), []
    except ConfigError:
        pass
    bad, problems = set(), []
    for name in sorted(k for k in environ if k.startswith("SNUG_")):
        try:
            EngineSettings.from_env({name: environ[name]})
        except ConfigError as exc:
            bad.add(name)
            problems.append(f"Environment variable {name} is ignored: {exc}")
    try:
        kept = {k: v for k, v in environ.items() if k not in bad}
        return EngineSettings.from_env(kept), problems
    except ConfigError as exc:  # only wrong together: fall back to every default
        return EngineSettings(), [*problems, f"The SNUG_* variables are ignored: {exc}"]


class AppSettings(QObject):
    """Typed access to QSettings; emits `changed(key, value)` on every write.

    Pass a QSettings to use another store (tests use an ini file in a temp folder).
    `problems` lists, once each, the stored values and SNUG_* variables that were ignored.
    """

    changed = Signal(str, object)

    def __init__(self, store: QSettings | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._store = store if store is not None else QSettings("Snug", "Snug")
        self.problems: list[str] = []
        for field in FIELDS:  # find the bad values now, so that start-up can show them
            self.get(field.key)
        self.engine_settings()

    @property
    def store(self) -> QSettings:
        return self._store

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
            log.warning("%s", text)

    def get(self, key: str) -> object:
        field = BY_KEY[key]
        if not self._store.contains(key):
            return field.default
        raw = self._store.value(key)
        try:
            return parse(field, raw)
        except SettingError as exc:
            self._problem(
                f"Setting {key} = {reprlib.repr(raw)} is not valid ({exc}); "
                f"using the default {field.default!r}."
            )
            return field.default

    def set(self, key: str, value: object) -> None:
        """Store a value; SettingError (naming the key) when the setting cannot hold it."""
        field = BY_KEY[key]
        try:
            value = parse(field, value)
        except SettingError as exc:
            raise SettingError(f"{key} = {reprlib.repr(value)} is not valid: {exc}") from None
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
    def kv_cache(self) -> str:
        return str(self.get("engine/kv_cache"))

    @property
    def refuse_cpu(self) -> bool:
        return bool(self.get("engine/refuse_cpu"))

    @property
    def thinking(self) -> bool:
        return bool(self.get("chat/thinking"))

    @property
    def thinking_budget(self) -> int:
        return int(self.get("chat/thinking_budget"))

    @property
    def system_prompt(self) -> str:
        return str(self.get("chat/system_prompt"))

    def engine_settings(self) -> EngineSettings:
        """EngineSettings from the environment, with the fields these settings own replaced.

        Reserve, limit, backend, the KV cache and the prompt cache's budgets come from here,
        and its disk tier goes in the app's data folder (SNUG_PROMPT_CACHE_DIR moves it);
        everything else the environment sets (SNUG_COMPUTE_DTYPE, SNUG_OVERLAP_LAUNCHES,
        SNUG_CACHE_DIR...) passes through, less any variable the engine refuses (reported
        in `problems`).
        """
        reserve = float(self.get("memory/reserve_gib"))
        limit = float(self.get("memory/limit_gib"))
        env, problems = env_settings(os.environ)
        for text in problems:
            self._problem(text)
        return replace(
            env,
            reserve_bytes=int(round(reserve * GIB)),
            limit_bytes=int(round(limit * GIB)) or None,  # 0 means no limit
            backend=self.backend,
            kv_cache=self.kv_cache,
            draft_tokens=str(self.get("engine/draft_tokens")),
            prompt_cache_dir=env.prompt_cache_dir or str(default_prompt_cache_dir(os.environ)),
            prompt_cache_host_bytes=int(round(float(self.get("cache/host_gib")) * GIB)),
            prompt_cache_disk_bytes=int(round(float(self.get("cache/disk_gib")) * GIB)),
        )

    def sampling(self, thinking: bool = False) -> dict[str, float | int]:
        """A reply's sampling: the set for replies that think first (`thinking`), or the
        one for replies without thinking; the token limit is one for both."""
        group = "thinking_sampling" if thinking else "sampling"
        out = {name: kind(self.get(f"{group}/{name}")) for name, kind, *_ in SAMPLING_KNOBS}
        return {**out, "max_new_tokens": int(self.get("sampling/max_new_tokens"))}
