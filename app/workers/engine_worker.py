"""The engine worker: one long-lived QObject on one QThread owns every engine call.

GUI thread                         worker thread
  EngineController.load()  --sig-->  EngineWorker.load()      (slow, blocks only this thread)
  EngineController.send()  --sig-->  EngineWorker.generate()  loops over engine.generate(...)
  EngineController.stop()  -- threading.Event.set() --------> checked by the engine per token
  widgets  <--- tokens(batched ~30 ms), finished, failed, loaded, held ---

Exceptions never cross the thread: they are caught here and emitted with the exception's
class name and message.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app import engine_bridge
from app.engine_bridge import EngineLike, Loader

BATCH_S = 0.03
CPU_REFUSED = (
    "This engine would run on the CPU (numpy backend), and the setting "
    "'Refuse CPU mode' is on. Turn it off in Settings > Engine to run on the CPU, "
    "or run Snug on a machine with an NVIDIA GPU."
)


class CpuModeRefused(Exception):
    """The user asked never to run on the CPU, and no GPU backend is available."""


class EngineWorker(QObject):
    """Lives on the engine thread. Its slots are called through queued signals only."""

    load_progress = Signal(str, float)
    loaded = Signal(dict)
    load_failed = Signal(str, str)
    unloaded = Signal()
    tokens = Signal(int, str)
    finished = Signal(int, dict)
    failed = Signal(int, str, str)
    held = Signal(object)  # bytes: can exceed a 32-bit int
    stopped = Signal()

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self._loader = loader
        self._engine: EngineLike | None = None

    @Slot(dict)
    def load(self, request: dict) -> None:
        self._unload_quietly()
        try:
            settings = request["settings"]
            no_gpu = settings.backend == "numpy" or request.get("gpu_present") is False
            if request.get("refuse_cpu") and no_gpu:
                raise CpuModeRefused(CPU_REFUSED)
            engine = self._loader(
                request["model_dir"],
                settings,
                request["context"],
                request["streams"],
                request["max_rows"],
                self._progress,
            )
            if request.get("refuse_cpu") and engine.backend_name != "cuda":
                engine.unload()
                raise CpuModeRefused(CPU_REFUSED)
        except Exception as exc:  # every failure reaches the GUI as a message
            self.load_failed.emit(type(exc).__name__, str(exc))
            return
        self._engine = engine
        self.loaded.emit(
            {
                "model_dir": request["model_dir"],
                "backend": engine.backend_name,
                "decision": getattr(engine, "decision", None),
                "held": self._held(),
                "context": request["context"],
                "streams": request["streams"],
            }
        )
        self.held.emit(self._held())

    def _progress(self, stage: str, fraction: float) -> None:
        self.load_progress.emit(stage, float(fraction))

    @Slot(int, list, object, object, object)
    def generate(
        self, request_id: int, messages: list, params: Any, thinking: Any, cancel: Any
    ) -> None:
        if self._engine is None:
            self.failed.emit(request_id, "NoModelLoaded", "Load a model before sending a message.")
            return
        pending: list[str] = []
        last = time.monotonic()
        final: Any = None
        try:
            ids = self._engine.chat_ids(messages, enable_thinking=thinking)
            for event in self._engine.generate(ids, params, cancel):
                if event.text:
                    pending.append(event.text)
                now = time.monotonic()
                if pending and (now - last >= BATCH_S or event.finished):
                    self.tokens.emit(request_id, "".join(pending))
                    pending.clear()
                    last = now
                if event.finished:
                    final = event
                    break
        except Exception as exc:  # ScratchGrowFailed, out of memory, template errors...
            if pending:
                self.tokens.emit(request_id, "".join(pending))
            self.failed.emit(request_id, type(exc).__name__, str(exc))
            self.held.emit(self._held())
            return
        if pending:
            self.tokens.emit(request_id, "".join(pending))
        self.finished.emit(request_id, _summary(final, cancel))
        self.held.emit(self._held())

    @Slot()
    def unload(self) -> None:
        self._unload_quietly()
        self.unloaded.emit()
        self.held.emit(0)

    @Slot()
    def shutdown(self) -> None:
        """Last call on this thread: unload, then end the thread's event loop."""
        self._unload_quietly()
        self.stopped.emit()
        QThread.currentThread().quit()

    def _unload_quietly(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.unload()
            except Exception as exc:  # unloading must not take the thread down
                self.load_failed.emit(type(exc).__name__, f"while unloading: {exc}")

    def _held(self) -> int:
        try:
            return int(self._engine.held_bytes()) if self._engine is not None else 0
        except Exception:
            return 0


def _summary(event: Any, cancel: threading.Event | None) -> dict:
    stats = getattr(event, "stats", None)
    reason = getattr(event, "finish_reason", None)
    if reason is None:
        reason = "cancelled" if cancel is not None and cancel.is_set() else "stop"
    out: dict[str, Any] = {"finish_reason": reason}
    if stats is not None:
        for name in ("prompt_tokens", "new_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s"):
            out[name] = getattr(stats, name, None)
    return out


class EngineController(QObject):
    """GUI-side handle on the engine thread. Widgets talk to this, never to the engine.

    States: "empty" (no model), "loading", "ready", "generating".
    """

    state_changed = Signal(str)
    load_progress = Signal(str, float)
    loaded = Signal(dict)
    load_failed = Signal(str, str)
    unloaded = Signal()
    tokens = Signal(int, str)
    finished = Signal(int, dict)
    failed = Signal(int, str, str)
    held = Signal(object)  # bytes: can exceed a 32-bit int

    _do_load = Signal(dict)
    _do_generate = Signal(int, list, object, object, object)
    _do_unload = Signal()
    _do_shutdown = Signal()

    def __init__(self, loader: Loader | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("snug-engine")
        self._worker = EngineWorker(loader or engine_bridge.load_engine)
        self._worker.moveToThread(self._thread)
        self._do_load.connect(self._worker.load)
        self._do_generate.connect(self._worker.generate)
        self._do_unload.connect(self._worker.unload)
        self._do_shutdown.connect(self._worker.shutdown)
        w = self._worker
        w.load_progress.connect(self.load_progress)
        w.loaded.connect(self._on_loaded)
        w.load_failed.connect(self._on_load_failed)
        w.unloaded.connect(self._on_unloaded)
        w.tokens.connect(self.tokens)
        w.finished.connect(self._on_finished)
        w.failed.connect(self._on_failed)
        w.held.connect(self.held)
        self._thread.finished.connect(self._worker.deleteLater)
        self._thread.start()
        self._state = "empty"
        self._info: dict = {}
        self._next_id = 0
        self._active: int | None = None
        self._cancel: threading.Event | None = None

    @property
    def state(self) -> str:
        return self._state

    @property
    def info(self) -> dict:
        """What the last successful load reported (model_dir, backend, decision, held)."""
        return dict(self._info)

    @property
    def thread(self) -> QThread:
        return self._thread

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)

    def load(self, request: dict) -> None:
        self.stop()
        self._set_state("loading")
        self._do_load.emit(request)

    def unload(self) -> None:
        self.stop()
        self._do_unload.emit()

    def send(self, messages: list[dict[str, str]], params: Any, thinking: bool | None) -> int:
        """Start a reply; returns its request id (tokens/finished/failed carry it)."""
        self.stop()
        self._next_id += 1
        self._active = self._next_id
        self._cancel = threading.Event()
        self._set_state("generating")
        self._do_generate.emit(self._active, list(messages), params, thinking, self._cancel)
        return self._active

    def stop(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop generation, unload, end the thread and wait for it. Safe to call twice."""
        if not self._thread.isRunning():
            return True
        self.stop()
        self._do_shutdown.emit()
        return self._thread.wait(timeout_ms)

    def _on_loaded(self, info: dict) -> None:
        self._info = info
        self._set_state("ready")
        self.loaded.emit(info)

    def _on_load_failed(self, cls: str, msg: str) -> None:
        self._info = {}
        self._set_state("empty")
        self.load_failed.emit(cls, msg)

    def _on_unloaded(self) -> None:
        self._info = {}
        self._set_state("empty")
        self.unloaded.emit()

    def _on_finished(self, request_id: int, summary: dict) -> None:
        if request_id == self._active:
            self._active, self._cancel = None, None
            self._set_state("ready")
        self.finished.emit(request_id, summary)

    def _on_failed(self, request_id: int, cls: str, msg: str) -> None:
        if request_id == self._active:
            self._active, self._cancel = None, None
            self._set_state("ready" if self._info else "empty")
        self.failed.emit(request_id, cls, msg)
