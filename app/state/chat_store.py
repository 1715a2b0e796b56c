"""The folder of chats: one JSON file per chat (app/state/chat_history.py's format) in
AppDataLocation/chats.

Every path is built from a checked id and lies inside the chats folder. A file that does
not hold a valid chat is reported in `ChatStore.problems` and the log, skipped, and never
written over.

A save writes `<id>.tmp` and renames it over `<id>.json`, so a save cut short leaves the
previous file whole; the next start finishes or drops the `.tmp` it left. A save that fails
(a full or read-only disk) keeps the chat in memory, says so (`save_failed`), and is tried
again with the next save.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths, QTextBoundaryFinder, Signal

from app.state import chat_history as chat_file  # its limits read at use (tests set them)
from app.state.chat_history import (
    Chat,
    ChatFileError,
    Turn,
    check_chat_id,
    read_chat,
)
from engine.attachments import Attachment

log = logging.getLogger(__name__)


def default_chats_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(base or Path.home() / ".local/share/Snug") / "chats"


class ChatStore(QObject):
    """All chats, newest first; saves a chat's file whenever it changes.

    Files that hold no valid chat are listed in `problems` (and logged) and left alone.
    Chats whose last save failed are in `unsaved`: each save tries them again.
    """

    chats_changed = Signal()
    chat_updated = Signal(str)
    save_failed = Signal(str, str)  # chat id; what went wrong and what to do

    def __init__(self, folder: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.folder = Path(folder) if folder is not None else default_chats_dir()
        self._chats: dict[str, Chat] = {}
        self.problems: list[str] = []
        self.unsaved: set[str] = set()
        self.writes = 0  # chat files written (saves are counted, not timed, by the tests)
        self._sizes: dict[str, int] = {}  # each chat file's bytes, as last read or written
        self.load_all()

    def takes(self, chat_id: str, turn: Turn) -> bool:
        """Whether the chat's file can take `turn` and a reply to it within MAX_CHAT_BYTES,
        the most a chat file is read back at start-up."""
        added = len(json.dumps(turn.to_dict(), ensure_ascii=False, indent=1).encode("utf-8"))
        room = chat_file.MAX_CHAT_BYTES - chat_file.REPLY_BYTES
        return self._sizes.get(chat_id, 0) + added <= room

    def load_all(self) -> None:
        self._chats.clear()
        self.problems = []
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._problem(
                f"The chats folder {self.folder} cannot be made ({exc.strerror or exc}): "
                "chats are not saved until it can. Check that its parent folder is writable."
            )
        for tmp in sorted(self._listed("*.tmp")):
            self._leftover(tmp)
        for path in sorted(self._listed("*.json")):
            try:
                self.path(path.stem)  # a plain name that stays inside the folder
                chat = read_chat(path)
            except ChatFileError as exc:
                self._problem(
                    f"Skipped chat file {exc}. It is kept as it is in {self.folder}: "
                    "restore it from a backup, or move it out of that folder."
                )
                continue
            self._chats[chat.id] = chat
            self._sizes[chat.id] = path.stat().st_size
        self.chats_changed.emit()

    def _listed(self, pattern: str) -> list[Path]:
        try:
            return list(self.folder.glob(pattern))
        except OSError as exc:  # the folder cannot be read
            self._problem(f"The chats folder {self.folder} cannot be read: {exc.strerror}")
            return []

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)
            log.warning("%s", text)

    def _leftover(self, tmp: Path) -> None:
        """A `<id>.tmp` that a save cut short left behind (a crash, a full disk): where it
        holds the whole chat and is newer than `<id>.json` (or that is missing), the save is
        finished; where it is cut short or older, it goes (`<id>.json` is the last whole
        save). Next to an unreadable `<id>.json` both stay, and the problem says so."""
        try:
            path = self.path(tmp.stem)
        except ChatFileError:
            return  # not one of ours
        try:
            saved = read_chat(tmp, expect_id=tmp.stem)
        except ChatFileError:
            saved = None
        try:
            if saved is None:
                tmp.unlink()
                log.info("Removed %s, a save cut short (%s is the last whole one)", tmp, path)
                return
            if path.exists():
                try:
                    if read_chat(path).updated >= saved.updated:
                        tmp.unlink()
                        return
                except ChatFileError:
                    self._problem(
                        f"{tmp.name} holds a whole copy of the chat in {path.name}, which "
                        f"cannot be read: rename {tmp.name} to {path.name} to use it"
                    )
                    return
            tmp.replace(path)
            log.info("Finished a save cut short: %s is now %s", tmp.name, path.name)
        except OSError as exc:
            log.warning("Could not clear up %s: %s", tmp, exc)

    def path(self, chat_id: str) -> Path:
        """`<folder>/<id>.json`; ChatFileError for an id that is not a plain name."""
        try:
            path = self.folder / f"{check_chat_id(chat_id)}.json"
        except ChatFileError as exc:
            raise ChatFileError(f"{chat_id}.json: {exc}") from None
        if path.resolve().parent != self.folder.resolve():
            raise ChatFileError(f"{path.name}: leads outside {self.folder}")
        return path

    def chats(self) -> list[Chat]:
        return sorted(self._chats.values(), key=lambda c: c.updated, reverse=True)

    def get(self, chat_id: str) -> Chat | None:
        return self._chats.get(chat_id)

    def create(self) -> Chat:
        chat = Chat.new()
        while chat.id in self._chats or self._taken(chat.id):  # never reuse a file
            chat = Chat.new()
        self._chats[chat.id] = chat
        self.save(chat)
        self.chats_changed.emit()
        return chat

    def _taken(self, chat_id: str) -> bool:
        path = self.path(chat_id)
        return path.exists() or path.is_symlink() or path.with_suffix(".tmp").exists()

    def delete(self, chat_id: str) -> bool:
        """Delete the chat and its file; False, with the chat kept and the reason said
        (`save_failed`), where the file cannot be removed."""
        chat = self._chats.get(chat_id)
        if chat is None:
            return False
        path = self.path(chat_id)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            self.save_failed.emit(
                chat_id,
                f"Could not delete the chat “{chat.title}”: {path} cannot be removed "
                f"({exc.strerror or exc}). Check that {self.folder} is writable.",
            )
            return False
        del self._chats[chat_id]
        self.unsaved.discard(chat_id)
        self.chats_changed.emit()
        return True

    def save(self, chat: Chat) -> bool:
        """Write the chat (and any whose last save failed); False where it could not be."""
        chat.updated = time.time()
        if chat.title == "New chat":
            first = next((_named(t) for t in chat.turns if t.role == "user"), "")
            if first.strip():
                chat.title = _title(first, TITLE_MAX_AUTO)
        return self._write(chat)

    def rename(self, chat_id: str, title: str) -> str:
        """Give the chat `title` (on one line, at most TITLE_MAX characters; its place in
        the list, by last message, stays). Returns the title it now has: the old one where
        `title` is blank."""
        chat = self._chats.get(chat_id)
        if chat is None:
            return ""
        if title.strip():
            chat.title = _title(title, TITLE_MAX)
            self._write(chat)
        return chat.title

    def set_pinned(self, chat_id: str, pinned: bool) -> None:
        """Pin the chat to the top of the list (or unpin it); its date stays."""
        chat = self._chats.get(chat_id)
        if chat is not None and chat.pinned != pinned:
            chat.pinned = pinned
            self._write(chat)

    def set_system_prompt(self, chat_id: str, prompt: str | None) -> None:
        """The chat's own system prompt (None: the settings' again); its place in the list,
        by last message, stays."""
        chat = self._chats.get(chat_id)
        if chat is not None and chat.system_prompt != prompt:
            chat.system_prompt = prompt
            self._write(chat)

    def set_draft(self, chat_id: str, text: str, files: Sequence[Attachment] | None = None) -> None:
        """What the chat's message box holds, unsent, kept with the chat, and the files
        attached to it (None: those kept already stay); its place in the list stays."""
        chat = self._chats.get(chat_id)
        if chat is None:
            return
        files = chat.draft_files if files is None else list(files)
        if chat.draft != text or chat.draft_files != files:
            chat.draft, chat.draft_files = text, files
            self._write(chat)

    def _write(self, chat: Chat) -> bool:
        saved = self._write_file(chat)
        self.chat_updated.emit(chat.id)
        if saved:
            for other in sorted(self.unsaved):  # the disk has room again
                if other in self._chats and not self._write_file(self._chats[other]):
                    break
        return saved

    def _write_file(self, chat: Chat) -> bool:
        """Write `<id>.tmp` and rename it over `<id>.json`. Where that fails, the file on
        disk stays as it was, the chat stays in memory (in `unsaved`), and `save_failed`
        says what to do."""
        path = self.path(chat.id)
        if self._chats.get(chat.id) is not chat and path.exists():
            raise ChatFileError(f"{path.name} belongs to another chat; it is not written over")
        tmp = path.with_suffix(".tmp")
        data = json.dumps(chat.to_dict(), ensure_ascii=False, indent=1).encode("utf-8")
        if len(data) > chat_file.MAX_CHAT_BYTES and chat.draft_files:
            # Past what a start reads back: the unsent files stay in memory, not written.
            unsent = {**chat.to_dict(), "draft_files": []}
            data = json.dumps(unsent, ensure_ascii=False, indent=1).encode("utf-8")
        self.writes += 1
        try:
            with open(tmp, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())  # on disk before it takes the file's place
            tmp.replace(path)
            self._sizes[chat.id] = len(data)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)  # a part-written file would only take room
            except OSError:
                pass
            self.unsaved.add(chat.id)
            message = (
                f"Could not save the chat “{chat.title}” to {path} ({exc.strerror or exc}). "
                f"It stays open here: free some disk space, or make {self.folder} writable; "
                "it is saved again with your next message."
            )
            log.warning("%s", message)
            self.save_failed.emit(chat.id, message)
            return False
        self.unsaved.discard(chat.id)
        return True


TITLE_MAX = 80  # characters of a title given by hand
TITLE_MAX_AUTO = 40  # characters of a title taken from the first message


def _named(turn: Turn) -> str:
    """A user turn's text, or its files' names where it has none (a chat's first title)."""
    return turn.content or ", ".join(a.name for a in turn.attachments)


def _title(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis: between two signs as
    the reader sees them (a flag, a family emoji, a letter and its accent stay whole)."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return _whole_signs(line, limit) + "…"


def _whole_signs(line: str, limit: int) -> str:
    """`line`'s first `limit` code points, less a sign (grapheme) they would halve; cut
    where it falls where a single sign is longer than `limit`."""
    units = line.encode("utf-16-le")  # Qt counts in UTF-16 units
    at = len(line[:limit].encode("utf-16-le")) // 2
    finder = QTextBoundaryFinder(QTextBoundaryFinder.BoundaryType.Grapheme, line)
    finder.setPosition(at)
    if not finder.isAtBoundary():
        at = max(finder.toPreviousBoundary(), 0)
    return units[: 2 * at].decode("utf-16-le") if at else line[:limit]
