"""The chat list beside the chat: New chat, a search box (titles and messages), the chats
under date headings (Today, Yesterday, ...), and each chat renamed, exported or deleted
from its context menu or the keyboard."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QStandardPaths, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat_controller import ChatController
from app.dates import date_group
from app.state.chat_history import Chat
from app.widgets.chat_groups import GROUP_ROLE, GroupHeadings
from app.widgets.plain import plain_tip

DOCUMENTS = QStandardPaths.StandardLocation.DocumentsLocation
SEARCH_MS = 200  # the pause in typing after which the search runs
DAY_CHECK_MS = 60_000  # how often the headings look for a new day (Today becomes Yesterday)
PINNED = "Pinned"  # the heading of the pinned chats, listed first
KEY_PRESS, SHORTCUT_OVERRIDE = QEvent.Type.KeyPress, QEvent.Type.ShortcutOverride
MARKDOWN = "Markdown (*.md)"  # the export's file type: a name typed without one gets .md


def place(chat: Chat) -> tuple[bool, float]:
    """A chat's place in the list, smallest first: pinned chats first, each part newest
    first."""
    return (not chat.pinned, -chat.updated)


def matches(chat: Chat, query: str) -> bool:
    """Whether the chat's title or one of its messages holds `query` (casefolded)."""
    return query in chat.title.casefold() or any(t.holds(query) for t in chat.turns)


class ChatSidebar(QWidget):
    """The list of chats, newest first, with a New chat button and a search box (titles and
    messages). `found_picked(query)`: a chat the search found was picked."""

    found_picked = Signal(str)

    def __init__(self, chats: ChatController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.chats = chats
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 12)
        layout.setSpacing(8)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("newChat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(chats.new_chat)
        layout.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setObjectName("chatSearch")
        self.search.setPlaceholderText("Search chats")
        self.search.setToolTip("Search chats by title or message (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        # Searched once typing pauses, not at each key: a search reads every message.
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_MS)
        self._search_timer.timeout.connect(self.refresh)
        self.search.textChanged.connect(self._search_typed)
        layout.addWidget(self.search)
        self.list = QListWidget()
        self.list.setObjectName("chatList")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.headings = GroupHeadings(self.list)
        self.list.setItemDelegate(self.headings)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.currentItemChanged.connect(self._picked)
        self.list.itemPressed.connect(self._pressed)  # the chat on show, found: its message
        self._just_picked: QListWidgetItem | None = None  # picked by the press under way
        self.list.itemChanged.connect(self._renamed)  # an item's title edited in place
        self.list.setEditTriggers(
            QListWidget.EditTrigger.DoubleClicked | QListWidget.EditTrigger.EditKeyPressed
        )
        layout.addWidget(self.list, 1)
        QShortcut(
            QKeySequence(QKeySequence.StandardKey.Delete),
            self.list,
            activated=self._delete_current,
            context=Qt.ShortcutContext.WidgetShortcut,
        )
        self.search.installEventFilter(self)  # Esc clears it, Down and Enter go to the list
        self._items: dict[str, QListWidgetItem] = {}  # the chats listed, by id
        self._today = date.today()
        self._day_timer = QTimer(self)
        self._day_timer.setInterval(DAY_CHECK_MS)
        self._day_timer.timeout.connect(self._new_day)
        self._day_timer.start()
        chats.store.chats_changed.connect(self.refresh)
        chats.store.chat_updated.connect(self._chat_updated)
        chats.current_changed.connect(lambda _id: self._show_current())
        self.refresh()

    def _search_typed(self, text: str) -> None:
        if text.strip():
            self._search_timer.start()  # again from the start at each key
        else:  # cleared: every chat, at once
            self._search_timer.stop()
            self.refresh()

    def _query(self) -> str:
        return self.search.text().strip().casefold()

    def refresh(self) -> None:
        """The whole list again: the chats (those the search finds), pinned first, newest
        first."""
        self._search_timer.stop()
        self.list.blockSignals(True)
        self.list.clear()
        self._items = {}
        query = self._query()
        for chat in sorted(self.chats.store.chats(), key=place):
            if not query or matches(chat, query):
                self.list.addItem(self._item(chat))
        self._regroup()
        self.list.blockSignals(False)
        self._show_current()

    def _regroup(self) -> None:
        """Each item's heading: its group's name on the first chat of each group. Only the
        items whose heading changes are touched (a save moves one chat to the top)."""
        self._today = date.today()
        last, changed = None, False
        for row in range(self.list.count()):
            item = self.list.item(row)
            chat = self.chats.store.get(item.data(Qt.ItemDataRole.UserRole))
            if chat is None:  # gone: the list is built again (chats_changed)
                continue
            group = PINNED if chat.pinned else date_group(chat.updated, self._today)
            heading = group if group != last else None
            last = group
            if item.data(GROUP_ROLE) != heading:
                item.setData(GROUP_ROLE, heading)
                changed = True
        if changed:  # the rows' heights follow their headings
            self.list.doItemsLayout()

    def _new_day(self) -> None:
        if date.today() != self._today:
            self.list.blockSignals(True)
            self._regroup()
            self.list.blockSignals(False)

    def _item(self, chat: Chat) -> QListWidgetItem:
        item = QListWidgetItem(chat.title)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
        item.setData(Qt.ItemDataRole.UserRole, chat.id)
        item.setToolTip(plain_tip(chat.title))
        self._items[chat.id] = item
        return item

    def _show_current(self) -> None:
        item = self._items.get(self.chats.current.id)
        self.list.blockSignals(True)
        if item is None:  # not among the chats the search found
            self.list.setCurrentRow(-1)
        else:
            self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def _chat_updated(self, chat_id: str) -> None:
        """One chat saved: its item alone is changed, and moved where its last message puts
        it (a save during a reply must not rebuild a list of a thousand chats)."""
        chat = self.chats.store.get(chat_id)
        item = self._items.get(chat_id)
        if chat is None:
            return
        query = self._query()
        found = not query or matches(chat, query)
        self.list.blockSignals(True)
        if item is not None and self._renaming(item):
            # Its title is being typed in place (a reply saves the chat as it streams): the
            # item stays, as a move would close the editor and lose what is typed; the save
            # the rename makes moves it.
            self._regroup()
            self.list.blockSignals(False)
            return
        if item is not None:
            self.list.takeItem(self.list.row(item))
            del self._items[chat_id]
        if found:
            row = 0  # before the first chat listed after this one
            while row < self.list.count():
                other = self.chats.store.get(self.list.item(row).data(Qt.ItemDataRole.UserRole))
                if other is None or place(other) > place(chat):
                    break
                row += 1
            self.list.insertItem(row, self._item(chat))
        self._regroup()
        self.list.blockSignals(False)
        self._show_current()

    def _renaming(self, item: QListWidgetItem) -> bool:
        """Whether `item`'s title is being edited in place."""
        edited = self.headings.editing
        return edited is not None and edited.isValid() and edited.row() == self.list.row(item)

    def _picked(self, item: QListWidgetItem | None, _prev: object = None) -> None:
        if item is not None:
            self.chats.select(item.data(Qt.ItemDataRole.UserRole))
            if self._query():  # a chat the search found: the chat shows where
                self.found_picked.emit(self._query())
                # A press that picked it is not taken again as a press on the chat on show.
                self._just_picked = item
                QTimer.singleShot(0, self, self._forget_picked)

    def _forget_picked(self) -> None:
        self._just_picked = None

    def _pressed(self, item: QListWidgetItem) -> None:
        """A click on the chat on show, found by the search: it goes to what was found."""
        if item is self._just_picked:
            self._just_picked = None
        elif QApplication.mouseButtons() != Qt.MouseButton.LeftButton:
            return  # a right click opens the chat's menu, and nothing more
        elif self._query() and item.data(Qt.ItemDataRole.UserRole) == self.chats.current.id:
            self.found_picked.emit(self._query())

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        menu = QMenu(self)
        chat = self.chats.store.get(item.data(Qt.ItemDataRole.UserRole))
        pinned = chat is not None and chat.pinned
        pin = menu.addAction("Unpin chat" if pinned else "Pin chat")
        rename = menu.addAction("Rename chat")
        export = menu.addAction("Export as Markdown…")
        delete = menu.addAction("Delete chat")
        chosen = menu.exec(self.list.mapToGlobal(pos))
        if chosen is pin:
            self.chats.store.set_pinned(item.data(Qt.ItemDataRole.UserRole), not pinned)
        elif chosen is rename:
            self.list.editItem(item)
        elif chosen is export:
            self.export(item.data(Qt.ItemDataRole.UserRole))
        elif chosen is delete:
            self.delete(item.data(Qt.ItemDataRole.UserRole))

    def delete(self, chat_id: str) -> bool:
        """Delete the chat once the user says so (its file goes for good); True if deleted."""
        chat = self.chats.store.get(chat_id)
        if chat is None:
            return False
        box = QMessageBox(self)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Delete chat")
        box.setTextFormat(Qt.TextFormat.PlainText)  # the title as typed, never read as HTML
        box.setText(f"Delete the chat “{chat.title}”?")
        box.setInformativeText("Its messages are removed from this computer for good.")
        yes = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        deleted = box.clickedButton() is yes
        if deleted:
            self.chats.delete_chat(chat_id)
        self.list.setFocus()  # the keyboard stays on the list (at the chat now on show)
        return deleted

    def _delete_current(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.delete(item.data(Qt.ItemDataRole.UserRole))

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        """The search box: Esc clears it (Esc stops a reply elsewhere); Down or Enter moves
        to the chats found, the first one shown where the chat on show is not among them,
        and the chat shown at the message found."""
        kind = event.type()
        if watched is not self.search or kind not in (KEY_PRESS, SHORTCUT_OVERRIDE):
            return super().eventFilter(watched, event)
        key = event.key()
        if key == Qt.Key.Key_Escape and self.search.text():
            if kind == SHORTCUT_OVERRIDE:
                event.accept()  # the key comes to the box, not to the window's Esc
            else:
                self.search.clear()
            return True
        if kind == KEY_PRESS and key in (Qt.Key.Key_Down, Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if self._search_timer.isActive():  # typed a moment ago: searched now
                self.refresh()
            if self.list.count():
                if self.list.currentItem() is None:
                    self.list.setCurrentRow(0)  # shown where it was found (`_picked`)
                elif self._query():  # the chat on show, found: shown where it was found
                    self.found_picked.emit(self._query())
                self.list.setFocus()
            return True
        return super().eventFilter(watched, event)

    def export(self, chat_id: str) -> None:
        """Write the chat as a Markdown file the user names; the status line says where (or
        why it could not)."""
        chat = self.chats.store.get(chat_id)
        if chat is None:
            return
        name = re.sub(r'[\\/:*?"<>|\s]+', " ", chat.title).strip() or "chat"
        start = str(Path(QStandardPaths.writableLocation(DOCUMENTS) or Path.home()) / name)
        path, kind = QFileDialog.getSaveFileName(
            self, "Export chat", start + ".md", f"{MARKDOWN};;All files (*)"
        )
        if not path:
            return
        if kind == MARKDOWN and not Path(path).suffix and not Path(path).is_dir():
            # "notes" typed, the Markdown type chosen: notes.md, asked of where it exists
            path += ".md"
            if Path(path).is_file() and not self._replace(Path(path)):
                return
        try:
            Path(path).write_text(chat.markdown(), encoding="utf-8")
        except OSError as exc:
            self.chats.notice.emit(
                f"Could not export the chat to {path}: {exc.strerror or exc}. Choose another "
                "folder or name (Export as Markdown… again)."
            )
            return
        self.chats.notice.emit(f"Chat exported to {path}")

    def _replace(self, path: Path) -> bool:
        """Whether the user says to write over `path` (the dialog asked of the name without
        its .md)."""
        answer = QMessageBox.question(
            self,
            "Export chat",
            f"{path.name} already exists in {path.parent}. Replace it?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No,
        )
        return answer == QMessageBox.StandardButton.Yes

    def _renamed(self, item: QListWidgetItem) -> None:
        """The edited title saved with the chat (blank: the old one back). The list is
        rebuilt after the editor has let go of the item, not inside its signal."""
        chat_id, title = item.data(Qt.ItemDataRole.UserRole), item.text()

        def save() -> None:
            if self.chats.store.rename(chat_id, title) != title:
                self.refresh()  # nothing saved, or saved cut short: show what is kept

        QTimer.singleShot(0, self, save)  # not after the sidebar is gone
