"""The app's switch for serving its loaded model over the OpenAI API on this machine.

The engine worker loads through `wrap_loader(loader)`: a local Engine comes back wrapped in
a `ScheduledEngine`, so the app's chat and the server's clients share one scheduler (the
engine is touched by the scheduler's thread only). `start()` runs `engine.server` (uvicorn
on a thread of its own) over that scheduler and reports the URL; `stop()` ends it. Both
return at once: starting (the import, uvicorn binding its port) and stopping (uvicorn ending
its connections, up to seconds) happen on the controller's own thread, one after another
in the order asked, and their outcome comes back as signals. When the model is unloaded,
call `forget_engine()` (connect `EngineController.unloaded` to it); when another model is
loaded while serving, the server moves to it by itself. The served engine's `unload` (on
the worker thread: an Unload, or a Load of another model) stops the server first, so each
reply under way ends with a 503 that says the server is going (not cut short as if it were
whole); the GUI thread never waits for uvicorn's thread.

    GUI thread                     controller thread          own threads
      start() / stop()  ------->   start / stop uvicorn       uvicorn  --> Scheduler --> Engine
      state_changed, url, failed  <-------
    worker thread: wrap_loader's loader records the ScheduledEngine; before its unload,
    the server serving it is stopped there (after any start or stop still queued)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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
        # Starts and stops of uvicorn, in the order asked, off the GUI thread.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="snug-server")
        self._last: Future | None = None  # the last of them
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
        """Serve the loaded model: False (and `failed`) where none is loaded here or the
        address needs a key; else True, and the server starts on the controller's thread
        (`url_changed` once it listens, `failed` where it cannot)."""
        from engine.server.bind import check_bind

        self._options = (host, port, api_key or None)
        with self._lock:
            engine = self._engine
        try:
            if engine is None:
                raise SnugError(
                    "load a model on this machine with the server switched on (Settings, "
                    "Local server) to serve it"
                )
            check_bind(host, api_key)
        except SnugError as exc:
            self.stop()
            self.failed.emit(str(exc))
            return False
        self._submit(self._start_serving, engine, host, port, api_key or None)
        return True

    def stop(self) -> None:
        """End serving: said at once; the server's connections end on the controller's
        thread."""
        with self._lock:
            server, self._server, self._served = self._server, None, None
        if server is None:
            return
        self._submit(server.stop)
        self._say_stopped()

    def shutdown(self, timeout: float = 15.0) -> bool:
        """Stop serving and wait (up to `timeout` s) for the controller's thread to finish
        what it was asked; True when it did (the app's close)."""
        self.stop()
        last = self._last
        if last is not None:
            try:
                last.result(timeout)
            except Exception:  # noqa: BLE001 - its failure was said as it happened
                return last.done()
        self._pool.shutdown(wait=False)
        return True

    def _submit(self, work: Callable[..., Any], *args: Any) -> None:
        self._last = self._pool.submit(work, *args)

    # ----- the controller's thread -------------------------------------------------------------
    def _start_serving(
        self, engine: ScheduledEngine, host: str, port: int, api_key: str | None
    ) -> None:
        from engine.server.app import create_app
        from engine.server.runner import ServerThread

        with self._lock:
            current, old, self._server, self._served = self._engine, self._server, None, None
        if old is not None:
            old.stop()
        if current is not engine:  # unloaded or replaced since it was asked: not served
            if old is not None:
                self._stopped_for_unload.emit()
            return
        try:
            app = create_app(engine.scheduler, api_key=api_key)
            server = ServerThread(app, host, port).start()
        except (SnugError, OSError) as exc:
            message = str(exc)
            if port_taken(host, port):  # said in the app's words, not the command line's
                message = (
                    f"port {port} on {host} is in use by another program; choose another "
                    "in Settings > Local server > Server port, then load the model again"
                )
            if old is not None:
                self._stopped_for_unload.emit()
            self.failed.emit(message)
            return
        with self._lock:
            if self._engine is engine:
                self._server, self._served = server, engine
                server = None
        if server is not None:  # the model went while uvicorn started: not served
            server.stop()
            self._stopped_for_unload.emit()
            return
        self.state_changed.emit("running")
        self.url_changed.emit(self.url)

    def _stop_serving(self, engine: ScheduledEngine) -> None:
        """On the worker thread, before `engine` unloads: what the controller's thread was
        asked (a start of this engine among it) is done, then the server serving it ends."""
        last = self._last
        if last is not None:
            try:
                last.result()
            except Exception:  # noqa: BLE001 - its failure was said as it happened
                pass
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
