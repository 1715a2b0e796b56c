"""The app's switch for serving its loaded model over the OpenAI API on this machine.

The engine worker loads through `wrap_loader(loader)`: a local Engine comes back wrapped in
a `ScheduledEngine`, so the app's chat and the server's clients share one scheduler (the
engine is touched by the scheduler's thread only). `start()` runs `engine.server` (uvicorn
on a thread of its own) over that scheduler and reports the URL; `stop()` ends it. When the
model is unloaded, call `forget_engine()` (connect `EngineController.unloaded` to it); when
another model is loaded while serving, the server moves to it by itself. The served engine's
`unload` (on the worker thread: an Unload, or a Load of another model) stops the server
first, so each reply under way ends with a 503 that says the server is going (not cut
short as if it were whole) and the GUI thread never waits for uvicorn's thread.

    GUI thread                     worker thread              own threads
      start() / stop()  ------->   (nothing)                  uvicorn  --> Scheduler --> Engine
      state_changed, url  <------  wrap_loader's loader records the ScheduledEngine
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from engine.errors import SnugError

if TYPE_CHECKING:
    from engine.scheduled_engine import ScheduledEngine


class ServerController(QObject):
    """States: "stopped", "running"; `failed` carries a message for the user."""

    state_changed = Signal(str)
    url_changed = Signal(str)  # the base URL ("" when stopped)
    failed = Signal(str)
    _engine_replaced = Signal()  # emitted on the worker thread, handled on the GUI thread
    _stopped_for_unload = Signal()  # likewise

    def __init__(self, queue_size: int = 16, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.queue_size = queue_size
        self._engine: ScheduledEngine | None = None
        self._lock = threading.Lock()
        self._server: Any = None  # swapped under the lock: the worker thread stops it too
        self._served: ScheduledEngine | None = None  # the engine the server serves
        self._options: tuple[str, int, str | None] = ("127.0.0.1", 8000, None)
        self._engine_replaced.connect(self._follow_engine)
        self._stopped_for_unload.connect(self._say_stopped)

    # ----- the load path (worker thread) -----------------------------------------------------
    def wrap_loader(
        self, base: Callable[..., Any], serving: Callable[[], bool] = lambda: True
    ) -> Callable[..., Any]:
        """A Loader that returns local engines as ScheduledEngines and remembers them, when
        `serving()` says the model is to be served; otherwise the chat keeps the Engine's own
        reply loop (each step launched before the host reads the token before it)."""

        def load(request: Any, progress: Any = None) -> Any:
            from app.engine_bridge import is_local
            from engine.scheduled_engine import ScheduledEngine

            engine = base(request, progress)
            scheduled = None
            if is_local(engine) and serving():
                engine = scheduled = ScheduledEngine(engine, self.queue_size)
                scheduled.before_unload = lambda s=scheduled: self._stop_serving(s)
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
        server = self._server
        return server.url if server is not None else ""

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
            server = ServerThread(app, host, port).start()
        except (SnugError, OSError) as exc:
            message = str(exc)
            if port_taken(host, port):  # said in the app's words, not the command line's
                message = (
                    f"port {port} on {host} is in use by another program; choose another "
                    "in Settings > Local server > Server port, then load the model again"
                )
            self.failed.emit(message)
            return False
        with self._lock:
            self._server, self._served = server, engine
        self.state_changed.emit("running")
        self.url_changed.emit(server.url)
        return True

    def stop(self) -> None:
        with self._lock:
            server, self._server, self._served = self._server, None, None
        if server is None:
            return
        server.stop()
        self._say_stopped()

    def _stop_serving(self, engine: ScheduledEngine) -> None:
        """On the worker thread, before `engine` unloads: end the server serving it."""
        with self._lock:
            if self._served is not engine:
                return
            server, self._server, self._served = self._server, None, None
        server.stop()
        self._stopped_for_unload.emit()

    def _say_stopped(self) -> None:
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


def port_taken(host: str, port: int) -> bool:
    """Whether another program listens on `host`:`port` (binding there fails)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False
