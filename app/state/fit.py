"""FitAdvisor: the fit verdict for a library entry on this machine, for the panels to show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal

from app import planning
from app.state.catalog import Entry, Library
from app.state.machine import Machine
from app.state.settings import AppSettings

Planner = Callable[..., Any]
REPLAN_KEYS = {
    "memory/reserve_gib",
    "memory/limit_gib",
    "engine/context",
    "engine/streams",
    "engine/max_rows",
    "engine/backend",
}
FREE_STEP = 128 << 20  # re-plan when the card's free bytes move more than this


class FitAdvisor(QObject):
    """Plans with the machine's GPU and the user's settings; `changed` asks views to re-plan."""

    changed = Signal()

    def __init__(
        self,
        machine: Machine,
        settings: AppSettings,
        library: Library,
        planner: Planner | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.machine = machine
        self.settings = settings
        self.library = library
        self._planner = planner or planning.plan
        self._seen: tuple | None = None
        machine.updated.connect(self._machine_moved)
        settings.changed.connect(self._setting_changed)

    def _machine_moved(self) -> None:
        gpu = self.machine.gpu
        key = (
            None
            if gpu is None
            else (gpu.name, gpu.total_bytes, (gpu.free_bytes + self.machine.ours) // FREE_STEP)
        )
        key = (key, bool(self.machine.no_gpu))
        if key != self._seen:
            self._seen = key
            self.changed.emit()

    def _setting_changed(self, key: str, _value: object) -> None:
        if key in REPLAN_KEYS:
            if key == "memory/reserve_gib":
                self.machine.set_reserve(self.settings.engine_settings().reserve_bytes)
            self.changed.emit()

    def decide(
        self,
        entry: Entry,
        context: int | None = None,
        streams: int | None = None,
        max_rows: int | None = None,
    ) -> Any:
        """A Decision (or planning.PlanProblem) for `entry` at these sizes."""
        if self.machine.gpu is None and not self.machine.no_gpu:
            return planning.PlanProblem("Checking the GPU…", "Checking…")
        if self.settings.backend == "numpy":
            return planning.PlanProblem(
                "Backend is set to CPU (numpy) in Settings: the model runs on the CPU.",
                "CPU mode",
            )
        kwargs: dict[str, Any] = {
            "gpu": self.machine.gpu,
            "settings": self.settings.engine_settings(),
            "context": int(context or self.settings.context),
            "streams": int(streams or self.settings.streams),
            "max_rows": int(max_rows or self.settings.max_rows),
            "held": self.machine.engine_held,
        }
        if entry.local_dir is not None:
            kwargs["model_dir"] = entry.local_dir
        elif entry.shape:
            fmt = entry.fmt or "bf16"
            try:
                raw = self.library.shapes.get(entry.shape)
                config = planning.shape_config(entry.shape, fmt, entry.group_size, raw)
            except Exception as exc:
                return planning.PlanProblem(f"catalog shape {entry.shape}: {exc}", "Cannot plan")
            kwargs["shape"] = (config, fmt, entry.group_size)
        else:
            return planning.PlanProblem("Unknown model shape; download it to plan.", "Unknown")
        return self._planner(**kwargs)
