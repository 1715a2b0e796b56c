"""Chats and their storage: one JSON file per chat in AppDataLocation/chats."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths, Signal


@dataclass
class Turn:
    role: str  # "user" | "assistant" | "error"
    content: str
    thinking_enabled: bool = False
    stats: dict = field(default_factory=dict)


@dataclass
class Chat:
    id: str
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    turns: list[Turn] = field(default_factory=list)

    @classmethod
    def new(cls) -> Chat:
        return cls(id=uuid.uuid4().hex[:12])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> Chat:
        turns = [Turn(**t) for t in raw.get("turns", []) if isinstance(t, dict)]
        return cls(
            id=str(raw["id"]),
            title=str(raw.get("title", "New chat")),
            created=float(raw.get("created", time.time())),
            updated=float(raw.get("updated", time.time())),
            turns=turns,
        )

    def messages(self, system_prompt: str = "") -> list[dict[str, str]]:
        """The conversation as engine messages (error turns are not sent to the model)."""
        out = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
        for turn in self.turns:
            if turn.role in ("user", "assistant"):
                out.append({"role": turn.role, "content": turn.content})
        return out


def default_chats_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(base or Path.home() / ".local/share/Snug") / "chats"


class ChatStore(QObject):
    """All chats, newest first; saves a chat's file whenever it changes."""

    chats_changed = Signal()
    chat_updated = Signal(str)

    def __init__(self, folder: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.folder = Path(folder) if folder is not None else default_chats_dir()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._chats: dict[str, Chat] = {}
        self.load_all()

    def load_all(self) -> None:
        self._chats.clear()
        for path in self.folder.glob("*.json"):
            try:
                chat = Chat.from_dict(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a damaged file must not stop the app; it stays on disk
            self._chats[chat.id] = chat
        self.chats_changed.emit()

    def chats(self) -> list[Chat]:
        return sorted(self._chats.values(), key=lambda c: c.updated, reverse=True)

    def get(self, chat_id: str) -> Chat | None:
        return self._chats.get(chat_id)

    def create(self) -> Chat:
        chat = Chat.new()
        self._chats[chat.id] = chat
        self.save(chat)
        self.chats_changed.emit()
        return chat

    def delete(self, chat_id: str) -> None:
        if self._chats.pop(chat_id, None) is not None:
            (self.folder / f"{chat_id}.json").unlink(missing_ok=True)
            self.chats_changed.emit()

    def save(self, chat: Chat) -> None:
        chat.updated = time.time()
        if chat.title == "New chat":
            first = next((t.content for t in chat.turns if t.role == "user"), "")
            if first.strip():
                line = " ".join(first.split())
                chat.title = line[:40] + ("…" if len(line) > 40 else "")
        path = self.folder / f"{chat.id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(chat.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
        tmp.replace(path)
        self.chat_updated.emit(chat.id)
