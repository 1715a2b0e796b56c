"""The app's switch for serving its loaded model over the OpenAI API on this machine.

The engine worker loads through `wrap_loader(loader)`: a local Engine comes back wrapped in
a `ScheduledEngine`, so the app's chat and the server's clients share one scheduler (the
engine is touched by the scheduler's thread only). `start()` runs `engine.server` (uvicorn
on a thread of its own) over that scheduler and reports the URL; `stop()` ends it. When the
model is unloaded, call `stop()` (connect `EngineController.unloaded` to it); when another
model is loaded while serving, the server moves to it by itself.

    GUI thread                     worker thread              own threads
      start() / stop()  ------->   (nothing)                  uvicorn  --> Scheduler --> Engine
      state_changed, url  <------  wrap_loader's loader records the ScheduledEngine
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from engine.errors import SnugError

if TYPE_CHECKING:
    from engine.scheduler import ScheduledEngine


class ServerController(QObject):
    """States: "stopped", "running"; `failed` carries a message for the user."""

    state_changed = Signal(str)
    url_changed = Signal(str)  # the base URL ("" when stopped)
    failed = Signal(str)
    _engine_replaced = Signal()  # emitted on the worker thread, handled on the GUI thread

    def __init__(self, queue_size: int = 16, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.queue_size = queue_size
        self._engine: ScheduledEngine | None = None
        self._lock = threading.Lock()
        self._server: Any = None
        self._options: tuple[str, int, str | None] = ("127.0.0.1", 8000, None)
        self._engine_replaced.connect(self._follow_engine)

    # ----- the load path (worker thread) -----------------------------------------------------
    def wrap_loader(
        self, base: Callable[..., Any], serving: Callable[[], bool] = lambda: True
    ) -> Callable[..., Any]:
        """A Loader that returns local engines as ScheduledEngines and remembers them, when
        `serving()` says the model is to be served; otherwise the chat keeps the Engine's own
        reply loop (each step launched before the host reads the token before it)."""

        def load(request: Any, progress: Any = None) -> Any:
            from app.engine_bridge import is_local
            from engine.scheduler import ScheduledEngine

            engine = base(request, progress)
            scheduled = None
            if is_local(engine) and serving():
                engine = scheduled = ScheduledEngine(engine, self.queue_size)
            with self._lock:
                self._engine = scheduled
            self._engine_replaced.emit()
            return engine

        return load

    # ----- the switch (GUI thread) -----------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return self._server.url if self._server is not None else ""

    def start(self, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None) -> bool:
        """Serve the loaded model; False (and `failed`) when it cannot."""
        from engine.server.app import create_app
        from engine.server.runner import ServerThread, check_bind

        self.stop()
        self._options = (host, port, api_key or None)
        with self._lock:
            engine = self._engine
        if engine is None:
            self.failed.emit(
                "load a model on this machine with the server switched on (Settings, "
                "Local server) to serve it"
            )
            return False
        try:
            check_bind(host, api_key)
            app = create_app(engine.scheduler, api_key=api_key or None)
            self._server = ServerThread(app, host, port).start()
        except (SnugError, OSError) as exc:
            self._server = None
            self.failed.emit(str(exc))
            return False
        self.state_changed.emit("running")
        self.url_changed.emit(self._server.url)
        return True

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        self.state_changed.emit("stopped")
        self.url_changed.emit("")

    def forget_engine(self) -> None:
        """The model was unloaded: stop serving it."""
        with self._lock:
            self._engine = None
        self.stop()

    def _follow_engine(self) -> None:
        if self._server is None:
            return
        with self._lock:
            engine = self._engine
        if engine is None:
            self.stop()
        else:
            self.start(*self._options)
