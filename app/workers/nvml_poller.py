"""Polls the GPU's memory through NVML about twice a second, on its own QThread."""

from __future__ import annotations

import os
from collections.abc import Callable

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

NO_GPU = "No NVIDIA GPU found — running on the CPU (numpy backend)"


class NvmlSource:
    """Reads card 0 with pynvml. `open` raises when there is no driver or no card."""

    def __init__(self) -> None:
        self._nvml = None
        self._handle = None
        self.name = ""
        self.speed = None  # engine.memory.speed.CardSpeed: what the plan's prediction scales to
        self.capability = 0  # 10 * major + minor: whether the plan may count fused attention

    def open(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(self._handle)
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        from engine.device import nvml_capability, nvml_speed

        self.capability = nvml_capability(pynvml, self._handle)
        self.speed = nvml_speed(pynvml, self._handle, self.name, self.capability)

    def read(self) -> dict:
        nv, handle = self._nvml, self._handle
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
        ours = 0
        try:
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    ours += int(proc.usedGpuMemory)
        except Exception:  # per-process accounting is not available on every driver
            ours = 0
        return {
            "name": self.name,
            "total": int(mem.total),
            "used": int(mem.used),
            "free": int(mem.free),
            "ours": ours,
            "speed": self.speed,
            "capability": self.capability,
        }

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


class NvmlWorker(QObject):
    sample = Signal(dict)
    unavailable = Signal(str)

    def __init__(self, source_factory: Callable[[], object], interval_ms: int) -> None:
        super().__init__()
        self._factory = source_factory
        self._interval = interval_ms
        self._source = None
        self._timer: QTimer | None = None

    @Slot()
    def start(self) -> None:
        source = self._factory()
        try:
            source.open()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, no device...
            self.unavailable.emit(f"{NO_GPU}. ({type(exc).__name__})")
            return
        self._source = source
        self._timer = QTimer(self)
        self._timer.setInterval(self._interval)
        self._timer.timeout.connect(self._tick)
        self._timer.start()
        self._tick()

    def _tick(self) -> None:
        try:
            self.sample.emit(self._source.read())
        except Exception as exc:
            self.unavailable.emit(f"The GPU stopped answering ({type(exc).__name__}: {exc})")
            self.stop()

    @Slot()
    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if self._source is not None:
            self._source.close()
            self._source = None


class NvmlPoller(QObject):
    """GUI-side handle; `sample` carries name, total, used, free and ours (bytes)."""

    sample = Signal(dict)
    unavailable = Signal(str)
    _start = Signal()
    _stop = Signal()

    def __init__(
        self,
        source_factory: Callable[[], object] = NvmlSource,
        interval_ms: int = 500,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("snug-nvml")
        self._worker = NvmlWorker(source_factory, interval_ms)
        self._worker.moveToThread(self._thread)
        self._worker.sample.connect(self.sample)
        self._worker.unavailable.connect(self.unavailable)
        self._start.connect(self._worker.start)
        self._stop.connect(self._worker.stop)
        self._thread.finished.connect(self._worker.deleteLater)

    def start(self) -> None:
        self._thread.start()
        self._start.emit()

    def shutdown(self, timeout_ms: int = 3000) -> bool:
        if not self._thread.isRunning():
            return True
        self._stop.emit()
        self._thread.quit()
        return self._thread.wait(timeout_ms)
