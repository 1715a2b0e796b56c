"""The controllers: GUI-side objects that own the worker threads (the chat on top of them
is app/chat_controller.py).

Panels and widgets take one of these and subscribe to its signals; none of them imports a
worker or the engine. EngineController and DownloadManager start their worker's QThread in
`__init__` and end it in `shutdown()` (AppContext.shutdown calls them in order).

    EngineController   the engine thread (app/workers/engine_worker.py): load, send, stop
    DownloadManager    the download thread (app/workers/downloader.py): download, cancel
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal

from app import engine_bridge
from app.engine_bridge import Loader, LoadRequest
from app.workers.downloader import DownloadWorker
from app.workers.engine_worker import EngineWorker


class EngineController(QObject):
    """GUI-side handle on the engine thread. Widgets talk to this, never to the engine.

    States: "empty" (no model), "loading", "ready", "generating".
    """

    state_changed = Signal(str)
    load_progress = Signal(str, float)
    loaded = Signal(dict)
    load_failed = Signal(str, str)
    unloaded = Signal()
    tokens = Signal(int, str, int)  # request id, text, the reply's tokens so far
    prompt_progress = Signal(int, int, int)  # request id, the prompt's tokens run, of how many
    finished = Signal(int, dict)
    failed = Signal(int, str, str)
    held = Signal(object)  # bytes: can exceed a 32-bit int

    _do_load = Signal(object)  # LoadRequest
    _do_generate = Signal(int, object)  # request id, ReplyRequest
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
        w.prompt_progress.connect(self.prompt_progress)
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
        self._load_cancel: threading.Event | None = None
        self._loading_dir = ""  # the model the load under way reads

    @property
    def state(self) -> str:
        return self._state

    def in_use(self, model_dir: str) -> bool:
        """Whether the engine is loading `model_dir`, or has it loaded."""
        used = (self._loading_dir if self._state == "loading" else "", self._info.get("model_dir"))
        return bool(model_dir) and model_dir in used

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

    def load(self, request: LoadRequest) -> None:
        self.stop()
        # A reply under way stops; its end (finished, failed) still reaches the chat, but
        # no longer sets the state: the engine is loading until this load ends.
        self._active, self._cancel = None, None
        self._loading_dir = str(request.model_dir)
        self._set_state("loading")
        self._load_cancel = threading.Event()
        self._do_load.emit(replace(request, cancel=self._load_cancel))

    def cancel_load(self) -> None:
        """Stop the load under way at its next stage (a first load compiles for a while)."""
        if self._load_cancel is not None and self.state == "loading":
            self._load_cancel.set()

    def unload(self) -> None:
        self.stop()
        self._do_unload.emit()

    def send(
        self,
        messages: list[dict[str, str]],
        params: Any,
        thinking: bool | None,
        left_out: int = 0,
        partial: str = "",
        thinking_budget: int = 0,
    ) -> int:
        """Start a reply; returns its request id (tokens/finished/failed carry it).
        `left_out`, `partial`, `thinking_budget`: as engine_bridge.ReplyRequest's."""
        self.stop()
        self._next_id += 1
        self._active = self._next_id
        self._cancel = threading.Event()
        self._set_state("generating")
        request = engine_bridge.ReplyRequest(
            list(messages), params, thinking, self._cancel, int(left_out), partial, thinking_budget
        )
        self._do_generate.emit(self._active, request)
        return self._active

    def stop(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop generation and any load, unload, end the thread and wait for it. Safe to
        call twice."""
        if not self._thread.isRunning():
            return True
        self.stop()
        self.cancel_load()  # a load under way (a first one compiles) ends at its next stage
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


class DownloadManager(QObject):
    """GUI-side handle: owns the download thread; the library panel talks to this."""

    started = Signal(str, object)
    progress = Signal(str, object, object, float)
    finished = Signal(str, str)
    failed = Signal(str, str)
    cancelled = Signal(str)
    _do_download = Signal(str, object)

    def __init__(
        self,
        cache_dir: str | None = None,
        endpoint: str | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._thread = QThread()
        self._thread.setObjectName("snug-download")
        self._worker = DownloadWorker(cache_dir, endpoint)
        self._worker.moveToThread(self._thread)
        self._do_download.connect(self._worker.download)
        # `_done` first, so that views see `active` cleared when the forwarded signal arrives.
        self._worker.finished.connect(self._done)
        self._worker.failed.connect(self._done)
        self._worker.cancelled.connect(self._done)
        for name in ("started", "progress", "finished", "failed", "cancelled"):
            getattr(self._worker, name).connect(getattr(self, name))
        self._thread.finished.connect(self._worker.deleteLater)
        self._thread.start()
        self._active: str | None = None
        self._cancel: threading.Event | None = None

    @property
    def active(self) -> str | None:
        return self._active

    @property
    def cache_dir(self) -> str | None:
        return self._worker.cache_dir

    @property
    def endpoint(self) -> str | None:
        """The Hub's address (None: huggingface.co, or HF_ENDPOINT)."""
        return self._worker.endpoint

    def download(self, repo: str) -> bool:
        if self._active is not None:
            return False
        self._active = repo
        self._cancel = threading.Event()
        self._do_download.emit(repo, self._cancel)
        return True

    def cancel(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def _done(self, repo: str, *_rest: object) -> None:
        if repo == self._active:
            self._active, self._cancel = None, None

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        self.cancel()
        self._thread.quit()
        return self._thread.wait(timeout_ms)
