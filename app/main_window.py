"""The main window: chats on the left, the chat in the middle, model and VRAM on the right."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QLabel,
    QMainWindow,
    QSplitter,
    QStackedWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.context import AppContext
from app.panels.chat import ChatPanel
from app.panels.gauge import GaugePanel
from app.panels.library import LibraryPanel
from app.panels.load import LoadPanel
from app.panels.settings import SettingsPanel
from app.panels.sidebar import ChatSidebar
from app.panels.welcome import DONE_KEY, WelcomePanel, welcome_done
from app.planning import fmt_bytes
from app.remote_engine import DEFAULT_URL, RemoteTarget, model_of_key
from app.remote_wire import public
from app.state.catalog import Entry
from app.state.settings import BY_KEY

if TYPE_CHECKING:
    from app.panels.connect import ConnectDialog

LOADED_KEY = "model/loaded_dir"  # the model loaded when Snug last closed (Unload clears it)
REMOTE_URL_KEY, REMOTE_MODEL_KEY = "remote/url", "remote/model"  # the server connected to last
NAME_CHARS = 48  # the most of a model's name the status bar shows


class MainWindow(QMainWindow):
    def __init__(self, ctx: AppContext) -> None:
        super().__init__()
        self.ctx = ctx
        theme.apply(ctx.settings.get("app/theme"))  # light or dark before anything shows
        theme.follow_system()
        ctx.settings.changed.connect(
            lambda key, value: theme.apply(value) if key == "app/theme" else None
        )
        self.setWindowTitle("Snug")
        self.setMinimumSize(960, 600)
        self.sidebar = ChatSidebar(ctx.chats)
        self.chat = ChatPanel(ctx.chats)
        self.sidebar.found_picked.connect(self.chat.show_found)
        self.gauge = GaugePanel(ctx.machine)
        self.library = LibraryPanel(ctx.library, ctx.downloads, ctx.advisor)
        self.load = LoadPanel(ctx.advisor, ctx.engine)
        self.settings = SettingsPanel(ctx.settings, ctx.engine, server=ctx.server)
        self.welcome = WelcomePanel(ctx.advisor, ctx.library, ctx.downloads)
        self.center = QStackedWidget()
        self.center.addWidget(self.chat)
        self.center.addWidget(self.welcome)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("sideTabs")
        self.tabs.addTab(self.library, "Models")
        self.tabs.addTab(self.load, "Load")
        self.tabs.addTab(self.settings, "Settings")

        right = QWidget()
        right.setObjectName("rightColumn")
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(0)
        rl.addWidget(self.gauge)
        rl.addWidget(self.tabs, 1)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(self.center)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.sidebar.setMinimumWidth(180)
        right.setMinimumWidth(380)
        self.splitter.setSizes([220, 640, 420])
        self.setCentralWidget(self.splitter)

        self.connect_dialog: ConnectDialog | None = None  # made on first use (_connect)
        self.model_status = QLabel("No model loaded")
        self.model_status.setObjectName("statusModel")
        self.statusBar().addPermanentWidget(self.model_status)
        QShortcut(QKeySequence("Ctrl+N"), self, activated=self.new_chat)
        self.sidebar.new_button.clicked.connect(self._type_here)  # after the chat is made
        QShortcut(QKeySequence.StandardKey.Find, self, activated=self.sidebar.search.setFocus)
        QShortcut(QKeySequence.StandardKey.Quit, self, activated=self.close)
        for keys, step in (("Ctrl++", 1), ("Ctrl+=", 1), ("Ctrl+-", -1), ("Ctrl+0", 0)):
            QShortcut(QKeySequence(keys), self, activated=lambda step=step: self.text_size(step))

        self.library.chosen.connect(self.choose)
        self.library.connect_requested.connect(self._connect)
        self.library.in_use = ctx.engine.in_use
        ctx.engine.state_changed.connect(self._engine_state)
        ctx.engine.loaded.connect(self._engine_state)
        ctx.engine.held.connect(self._engine_state)
        ctx.engine.load_failed.connect(
            lambda cls, msg: self.statusBar().showMessage(f"Load failed: {cls}", 8000)
        )
        ctx.machine.gpu_missing.connect(lambda _r: self._engine_state())
        self.welcome.load_requested.connect(self._welcome_load)
        self.welcome.dismissed.connect(self.close_welcome)
        self.welcome.browse.connect(self._browse)
        ctx.engine.loaded.connect(lambda _info: self.close_welcome())
        ctx.engine.load_failed.connect(lambda cls, msg: self.welcome.load_failed(f"{cls}: {msg}"))
        self._restore()
        ctx.engine.loaded.connect(self._remember_loaded)
        self._closing = False  # a load ended by quitting is no failed load (closeEvent)
        ctx.engine.load_failed.connect(lambda *_: self._closing or self._forget_loaded())
        self.load.unload_button.clicked.connect(self._forget_loaded)
        self._last = self._last_loaded()
        ctx.machine.updated.connect(self._load_last)
        ctx.machine.gpu_missing.connect(lambda _r: self._load_last())
        self._load_last()
        self._engine_state()
        first_run = not welcome_done(ctx.settings.store) and ctx.engine.state == "empty"
        self.center.setCurrentWidget(self.welcome if first_run else self.chat)
        self._type_here()  # the window opens with the keyboard in the message box

    def new_chat(self) -> None:
        """A new chat (or the empty one on show), the keyboard in its message box."""
        self.ctx.chats.new_chat()
        self._type_here()

    def _type_here(self) -> None:
        if self.center.currentWidget() is self.chat:  # not behind the first-run view
            self.chat.input.setFocus()

    def text_size(self, step: int) -> None:
        """The chat's text a point larger (step 1), smaller (-1), or back to its default (0),
        within the setting's bounds."""
        field = BY_KEY["app/chat_text_size"]
        size = int(self.ctx.settings.get(field.key)) + step if step else field.default
        self.ctx.settings.set(field.key, int(max(field.lo, min(field.hi, size))))

    def choose(self, entry: Entry) -> None:
        self.load.set_entry(entry)
        self.tabs.setCurrentWidget(self.load)

    def choose_and_load(self, entry: Entry) -> None:
        self.choose(entry)
        self.load.load()

    def _welcome_load(self, entry: Entry) -> None:
        """The first-run view's model, downloaded: loaded, unless a model was loaded (or is
        loading) meanwhile, which stays."""
        if self.ctx.engine.state != "empty":
            self.statusBar().showMessage(
                f"{entry.title} is downloaded; the model loaded stays. Load it from the Models "
                "tab (Use) when you want it.",
                12000,
            )
            return
        self.choose_and_load(entry)

    def close_welcome(self) -> None:
        """Show the chat instead of the first-run view, for good."""
        self.center.setCurrentWidget(self.chat)
        self._type_here()
        self.ctx.settings.store.setValue(DONE_KEY, True)
        self.ctx.settings.store.sync()

    def _connect(self) -> None:
        """Chat with a model on an OpenAI-compatible server, through the engine worker. The
        dialog is made once and kept, so that what was typed in it stays; the address and
        model connected to last are remembered (not the key), unless the address holds a
        password."""
        from app.panels.connect import ConnectDialog

        if self.connect_dialog is None:
            store = self.ctx.settings.store
            url = str(store.value(REMOTE_URL_KEY, "") or "") or DEFAULT_URL
            model = str(store.value(REMOTE_MODEL_KEY, "") or "")
            self.connect_dialog = ConnectDialog(self, url=url, model=model)
            self.connect_dialog.target_chosen.connect(self._connect_to)
        self.connect_dialog.open()

    def _connect_to(self, target: RemoteTarget) -> None:
        if public(target.url) == target.url:  # no password in it
            self.ctx.settings.store.setValue(REMOTE_URL_KEY, target.url)
            self.ctx.settings.store.setValue(REMOTE_MODEL_KEY, target.model)
        self.ctx.engine.load(self.ctx.remote.request_for(target))

    def _browse(self) -> None:
        self.close_welcome()
        self.tabs.setCurrentWidget(self.library)

    def _restore(self) -> None:
        store = self.ctx.settings.store
        geometry = store.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
        columns = store.value("window/columns")  # the widths the columns were dragged to
        if isinstance(columns, QByteArray) and not columns.isEmpty():
            self.splitter.restoreState(columns)
        gone = self.ctx.library.bind_store(store)
        if gone:
            self.statusBar().showMessage(
                "No longer a model folder, taken off the list: " + ", ".join(gone), 12000
            )
        last = str(self.ctx.settings.get("model/last_dir"))
        for entry in self.ctx.library.entries():
            if last and entry.local_dir == last:
                self.library.select(entry.key)
                self.load.set_entry(entry)

    # -- the model loaded last time, loaded again at start ("app/load_last_model")
    def _last_loaded(self) -> Entry | None:
        if not self.ctx.settings.get("app/load_last_model"):
            return None
        folder = str(self.ctx.settings.store.value(LOADED_KEY, "") or "")
        found = [e for e in self.ctx.library.entries() if folder and e.local_dir == folder]
        return found[0] if found else None

    def _load_last(self) -> None:
        """Once the machine is known (a GPU, or none), load the model loaded when Snug last
        closed; an Unload, or a load that failed, means it is not loaded at the next start."""
        machine = self.ctx.machine
        if self._last is None or (machine.gpu is None and not machine.no_gpu):
            return
        entry, self._last = self._last, None
        if self.ctx.engine.state != "empty":
            return
        self.choose_and_load(entry)
        self.statusBar().showMessage(
            f"Loading {entry.title}, the model loaded last time "
            "(Settings > App: Load the last model at start)",
            10000,
        )

    def _remember_loaded(self, info: dict) -> None:
        if info.get("backend") != "remote" and info.get("model_dir"):
            self.ctx.settings.store.setValue(LOADED_KEY, str(info["model_dir"]))

    def _forget_loaded(self) -> None:
        self.ctx.settings.store.remove(LOADED_KEY)

    def _engine_state(self, *_args: object) -> None:
        engine = self.ctx.engine
        info = engine.info
        self.model_status.setToolTip("")
        if engine.state == "loading":
            text = "Loading model…"
        elif info:
            where = str(info.get("model_dir", ""))
            name = model_of_key(where) or self.ctx.library.title_of(where)
            self.model_status.setToolTip(name)
            if len(name) > NAME_CHARS:  # a server's model id can be long: its middle goes
                name = name[: NAME_CHARS // 2 - 1] + "…" + name[-(NAME_CHARS // 2) :]
            backend = info.get("backend")
            mode = {"cuda": "GPU", "remote": "runs on a remote server"}.get(backend, "CPU mode")
            text = f"{name} · {mode}"
            if backend != "remote":  # a remote model holds nothing here
                text += f" · {fmt_bytes(self.ctx.machine.engine_held)}"
        else:
            text = "No model loaded"
        if self.ctx.machine.no_gpu and not info:
            text += " · CPU mode (no NVIDIA GPU)"
        self.model_status.setText(text)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt override)
        self.ctx.settings.store.setValue("window/geometry", self.saveGeometry())
        self.ctx.settings.store.setValue("window/columns", self.splitter.saveState())
        self.chat.keep_draft()
        self._closing = True
        self.ctx.shutdown()
        super().closeEvent(event)
