"""Builds the app's state, controllers and pollers, and shuts them down in order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QSettings

from app.controllers import ChatController, DownloadManager, EngineController
from app.engine_bridge import Loader
from app.state.catalog import Library
from app.state.chat_history import ChatStore
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

    def shutdown(self) -> bool:
        """Stop generation, unload, and wait for every worker thread; True when all ended."""
        self.chats.stop()
        ok = self.engine.shutdown()
        ok = self.downloads.shutdown() and ok
        ok = self.poller.shutdown() and ok
        return ok


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
    engine = EngineController(loader)
    machine = Machine(settings.engine_settings().reserve_bytes)
    poller = NvmlPoller(gpu_source)
    poller.sample.connect(machine.on_sample)
    poller.unavailable.connect(machine.on_unavailable)
    engine.held.connect(machine.on_held)
    library = Library(cache_dir, catalog_path)
    downloads = DownloadManager(cache_dir, endpoint)
    advisor = FitAdvisor(machine, settings, library, planner)
    chats = ChatController(ChatStore(chats_dir), engine, settings)
    poller.start()
    return AppContext(settings, engine, chats, library, downloads, machine, poller, advisor)
