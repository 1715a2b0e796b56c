"""What the app knows of this machine's GPU: the latest NVML sample and what Snug holds."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.planning import Gpu
from app.state import host_fit

HISTORY_S = 60.0


class Machine(QObject):
    """Joins the NVML samples with the engine's own held bytes; the gauge draws this.

    Without a GPU, `ram_available()` is what CPU-mode verdicts are planned against.
    """

    updated = Signal()
    gpu_missing = Signal(str)

    def __init__(
        self,
        reserve_bytes: int = 0,
        parent: QObject | None = None,
        ram_source: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(parent)
        self._ram_source = ram_source
        self.gpu: Gpu | None = None
        self.no_gpu = ""  # a sentence, once we know there is no GPU
        self.engine_held = 0
        self.nvml_ours = 0
        self.reserve_bytes = reserve_bytes
        self.history: deque[tuple[float, int, int]] = deque()  # (t, used, ours)
        self._t0 = time.monotonic()

    def ram_available(self) -> int:
        """Bytes of RAM available now, plus what a loaded CPU-mode model holds (loading
        another model unloads it first)."""
        held = self.engine_held if self.no_gpu else 0
        source = self._ram_source or host_fit.available_ram
        return int(source()) + held

    @property
    def ours(self) -> int:
        return max(self.nvml_ours, self.engine_held)

    @property
    def others(self) -> int:
        return max(0, (self.gpu.used_bytes if self.gpu else 0) - self.ours)

    def on_sample(self, sample: dict) -> None:
        self.gpu = Gpu(
            name=str(sample.get("name", "GPU")),
            total_bytes=int(sample["total"]),
            free_bytes=int(sample["free"]),
            used_bytes=int(sample["used"]),
            speed=sample.get("speed"),
            capability=int(sample.get("capability", 0)),
        )
        self.nvml_ours = int(sample.get("ours", 0))
        self.no_gpu = ""
        now = time.monotonic() - self._t0
        self.history.append((now, self.gpu.used_bytes, self.ours))
        while self.history and self.history[0][0] < now - HISTORY_S:
            self.history.popleft()
        self.updated.emit()

    def on_unavailable(self, reason: str) -> None:
        self.gpu = None
        self.no_gpu = reason
        self.history.clear()
        self.gpu_missing.emit(reason)
        self.updated.emit()

    def on_held(self, nbytes: int) -> None:
        self.engine_held = int(nbytes)
        self.updated.emit()

    def set_reserve(self, nbytes: int) -> None:
        self.reserve_bytes = int(nbytes)
        self.updated.emit()
