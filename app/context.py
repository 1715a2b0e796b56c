"""Builds the app's state, controllers and pollers, and shuts them down in order.

The stored state (settings, chats) is read first and never stops the start: what it could
not use is collected in `AppContext.problems` for the window to show. Worker threads start
after that, and if anything fails once one has started, the started ones are shut down
before the error goes on (a QThread dropped while running aborts the process).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QSettings

from app import engine_bridge
from app.chat_controller import ChatController
from app.controllers import DownloadManager, EngineController
from app.engine_bridge import Loader
from app.remote_engine import RemoteLoader
from app.server_controller import ServerController
from app.state.catalog import Library
from app.state.chat_store import ChatStore
from app.state.fit import FitAdvisor, Planner
from app.state.machine import Machine
from app.state.settings import AppSettings
from app.workers.nvml_poller import NvmlPoller, NvmlSource


@dataclass
class AppContext:
    settings: AppSettings
    engine: EngineController
    chats: ChatController
    library: Library
    downloads: DownloadManager
    machine: Machine
    poller: NvmlPoller
    advisor: FitAdvisor
    server: ServerController
    remote: RemoteLoader  # connects the engine worker to a model served elsewhere
    problems: list[str] = field(default_factory=list)  # start-up warnings, for the user

    def shutdown(self) -> bool:
        """Stop generation, unload, and wait for every worker thread; True when all ended."""
        self.chats.stop()
        self.server.stop()
        ok = self.engine.shutdown()
        # What the engine's thread said last (the reply's last tokens, its end) reaches the
        # chat now: the event loop may not run again to deliver it.
        QCoreApplication.sendPostedEvents(self.engine)
        self.chats.close()
        self.advisor.shutdown()
        ok = self.downloads.shutdown() and ok
        ok = self.poller.shutdown() and ok
        return self.server.shutdown() and ok


def build_context(
    store: QSettings | None = None,
    chats_dir: Path | None = None,
    loader: Loader | None = None,
    gpu_source: Callable[[], object] = NvmlSource,
    cache_dir: str | None = None,
    endpoint: str | None = None,
    planner: Planner | None = None,
    catalog_path: Path | None = None,
) -> AppContext:
    settings = AppSettings(store)
    chat_store = ChatStore(chats_dir)
    reserve = settings.engine_settings().reserve_bytes
    problems = [*settings.problems, *chat_store.problems]
    started: list[Callable[[], object]] = []  # shutdowns of what has started, in order
    try:
        server = ServerController()
        remote = RemoteLoader(loader or engine_bridge.load_engine)
        engine = EngineController(
            server.wrap_loader(remote, lambda: bool(settings.get("server/enabled")))
        )
        started.append(engine.shutdown)
        engine.unloaded.connect(server.forget_engine)
        engine.loaded.connect(lambda _info: _serve_if_enabled(settings, server))
        machine = Machine(reserve)
        poller = NvmlPoller(gpu_source)
        started.append(poller.shutdown)
        poller.sample.connect(machine.on_sample)
        poller.unavailable.connect(machine.on_unavailable)
        engine.held.connect(machine.on_held)
        library = Library(cache_dir, catalog_path)
        downloads = DownloadManager(cache_dir, endpoint)
        started.append(downloads.shutdown)
        advisor = FitAdvisor(machine, settings, library, planner)
        chats = ChatController(chat_store, engine, settings)
        poller.start()
    except BaseException:
        for stop in reversed(started):
            stop()
        raise
    return AppContext(
        settings,
        engine,
        chats,
        library,
        downloads,
        machine,
        poller,
        advisor,
        server,
        remote,
        problems,
    )


def _serve_if_enabled(settings: AppSettings, server: ServerController) -> None:
    """After a load: serve the model when the setting says so (the loader made it shared)."""
    if settings.get("server/enabled"):
        server.start(port=int(settings.get("server/port")))
