"""Chats and their storage: one JSON file per chat in AppDataLocation/chats.

A chat's id is its file name (`<id>.json`), so ids are checked against CHAT_ID before any
path is built, and every path is checked to lie inside the chats folder. A file that does
not hold a valid chat (bad JSON, wrong shape, an id that is not its file name) is reported
in `ChatStore.problems` and the log, skipped, and never written over.
"""

from __future__ import annotations

import json
import logging
import math
import re
import reprlib
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths, Signal

from app.thinking import split_reply
from engine.attachments import Attachment, compose

log = logging.getLogger(__name__)
CHAT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
ROLES = ("user", "assistant", "error")
MAX_CHAT_BYTES = 64 << 20  # far above any real conversation; bounds the time a load takes


class ChatFileError(ValueError):
    """A chat file or id that cannot be used; the message names the file and the problem."""


def check_chat_id(chat_id: object) -> str:
    if not isinstance(chat_id, str) or not CHAT_ID.fullmatch(chat_id):
        raise ChatFileError(f"chat id {chat_id!r} is not 1-64 letters, digits, '_' or '-'")
    return chat_id


@dataclass
class Turn:
    role: str  # "user" | "assistant" | "error"
    content: str
    thinking_enabled: bool = False
    stats: dict = field(default_factory=dict)
    attachments: list[Attachment] = field(default_factory=list)  # a user's files

    @property
    def prompt(self) -> str:
        """What the model reads of the turn: its attached files, then its text."""
        return compose(self.content, self.attachments)

    @classmethod
    def from_dict(cls, raw: object, where: str) -> Turn:
        raw = _object(raw, where, ("role", "content", "thinking_enabled", "stats", "attachments"))
        role = _text(raw.get("role"), f"{where}.role")
        if role not in ROLES:
            raise ChatFileError(f"{where}.role is {_short(role)}, not one of {', '.join(ROLES)}")
        thinking = raw.get("thinking_enabled", False)
        if not isinstance(thinking, bool):
            raise ChatFileError(f"{where}.thinking_enabled is {_short(thinking)}, not true/false")
        return cls(
            role=role,
            content=_text(raw.get("content"), f"{where}.content"),
            thinking_enabled=thinking,
            stats=_stats(raw.get("stats", {}), f"{where}.stats"),
            attachments=_attachments(raw.get("attachments", []), f"{where}.attachments"),
        )


@dataclass
class Chat:
    id: str
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    turns: list[Turn] = field(default_factory=list)
    system_prompt: str | None = None  # this chat's own; None: the one in Settings > Chat
    draft: str = ""  # what the message box held when the chat was left, unsent

    @classmethod
    def new(cls) -> Chat:
        return cls(id=uuid.uuid4().hex[:12])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: object) -> Chat:
        """A chat from its JSON form; ChatFileError names the first field that is wrong."""
        keys = ("id", "title", "created", "updated", "turns", "system_prompt", "draft")
        raw = _object(raw, "the file", keys)
        try:
            chat_id = check_chat_id(raw.get("id"))
        except ChatFileError as exc:
            raise ChatFileError(f"id: {exc}") from None
        turns = raw.get("turns", [])
        if not isinstance(turns, list):
            raise ChatFileError(f"turns is {_short(turns)}, not a list")
        now = time.time()
        return cls(
            id=chat_id,
            title=_text(raw.get("title", "New chat"), "title"),
            created=_seconds(raw.get("created", now), "created"),
            updated=_seconds(raw.get("updated", now), "updated"),
            turns=[Turn.from_dict(t, f"turns[{i}]") for i, t in enumerate(turns)],
            system_prompt=(
                None
                if raw.get("system_prompt") is None
                else _text(raw["system_prompt"], "system_prompt")
            ),
            draft=_text(raw.get("draft", ""), "draft"),
        )

    def messages(self, system_prompt: str = "") -> list[dict[str, str]]:
        """The conversation as engine messages (error turns are not sent to the model), after
        the chat's own system prompt, else `system_prompt` (the settings')."""
        if self.system_prompt is not None:
            system_prompt = self.system_prompt
        out = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
        for turn in self.turns:
            if turn.role in ("user", "assistant"):
                out.append({"role": turn.role, "content": turn.prompt})
        return out

    def markdown(self) -> str:
        """The chat as a Markdown document: its title, then each message under its author;
        a reply's thinking in a collapsed <details> block before its answer."""
        parts = [f"# {self.title}"]
        if self.system_prompt and self.system_prompt.strip():
            parts.append(f"*System prompt:* {self.system_prompt.strip()}")
        for turn in self.turns:
            if turn.role == "assistant":
                split = split_reply(turn.content, turn.thinking_enabled)
                parts.append("**Snug**")
                if split.thinking:
                    parts.append(
                        f"<details><summary>Thought</summary>\n\n{split.thinking}\n\n</details>"
                    )
                parts.append(split.answer)
            else:
                parts.append("**You**" if turn.role == "user" else "**Engine error**")
                parts.append(turn.prompt)
        return "\n\n".join(parts) + "\n"


# Field checks for from_dict: each returns the value or raises ChatFileError naming the field.
NUMERIC_STATS = (
    "prompt_tokens",
    "new_tokens",
    "ttft_s",
    "prefill_tok_s",
    "decode_tok_s",
    "drafted",
    "drafts_kept",
    "left_out",  # messages left out of the prompt to fit the context (engine/context_fit.py)
)


def _short(value: object) -> str:
    return reprlib.repr(value)  # bounded: long strings, numbers and nesting are cut


def _object(raw: object, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(raw, dict):
        raise ChatFileError(f"{where} is {_short(raw)}, not an object")
    unknown = [k for k in raw if k not in keys]
    if unknown:
        raise ChatFileError(f"{where} has unknown field {_short(unknown[0])}")
    return raw


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ChatFileError(f"{where} is {_short(value)}, not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON allows it, the file could not be saved
        raise ChatFileError(f"{where} holds a character that is not valid Unicode") from None
    return value


def _number(value: object, where: str) -> float | int:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and isinstance(value, int):
        ok = abs(value) < 2**63
    if not ok or not math.isfinite(value):
        raise ChatFileError(f"{where} is {_short(value)}, not a finite number")
    return value


def _seconds(value: object, where: str) -> float:
    return float(_number(value, where))


def _stats(raw: object, where: str) -> dict:
    if not isinstance(raw, dict):
        raise ChatFileError(f"{where} is {_short(raw)}, not an object")
    out: dict = {}
    for key, value in raw.items():
        name = f"{where}.{_text(key, where + ' key')}"
        if key in NUMERIC_STATS or isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = _number(value, name)
        elif isinstance(value, bool):
            out[key] = value
        else:
            out[key] = _text(value, name)
    return out


def _attachments(raw: object, where: str) -> list[Attachment]:
    if not isinstance(raw, list):
        raise ChatFileError(f"{where} is {_short(raw)}, not a list")
    out = []
    for i, item in enumerate(raw):
        item = _object(item, f"{where}[{i}]", ("name", "text"))
        name = _text(item.get("name"), f"{where}[{i}].name")
        out.append(Attachment(name, _text(item.get("text"), f"{where}[{i}].text")))
    return out


def read_chat(path: Path) -> Chat:
    """The chat stored in `path`; ChatFileError, naming the file, for anything else."""
    try:
        size = path.stat().st_size
        if size > MAX_CHAT_BYTES:
            raise ChatFileError(f"{size} bytes is more than a chat file holds")
        chat = Chat.from_dict(json.loads(path.read_bytes()))
    except ChatFileError as exc:
        raise ChatFileError(f"{path.name}: {exc}") from None
    except (OSError, ValueError, RecursionError) as exc:  # unreadable, not JSON, too deep
        text = str(exc)[:120]
        raise ChatFileError(f"{path.name}: {type(exc).__name__}: {text}") from None
    if chat.id != path.stem:
        raise ChatFileError(f"{path.name}: the id {chat.id!r} is not the file's name")
    return chat


def default_chats_dir() -> Path:
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.AppDataLocation)
    return Path(base or Path.home() / ".local/share/Snug") / "chats"


class ChatStore(QObject):
    """All chats, newest first; saves a chat's file whenever it changes.

    Files that hold no valid chat are listed in `problems` (and logged) and left alone.
    """

    chats_changed = Signal()
    chat_updated = Signal(str)

    def __init__(self, folder: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.folder = Path(folder) if folder is not None else default_chats_dir()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._chats: dict[str, Chat] = {}
        self.problems: list[str] = []
        self.load_all()

    def load_all(self) -> None:
        self._chats.clear()
        self.problems = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                self.path(path.stem)  # a plain name that stays inside the folder
                chat = read_chat(path)
            except ChatFileError as exc:
                self.problems.append(f"Skipped chat file {exc} (the file is kept as it is)")
                log.warning("%s", self.problems[-1])
                continue
            self._chats[chat.id] = chat
        self.chats_changed.emit()

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
        while chat.id in self._chats or self.path(chat.id).exists():  # never reuse a file
            chat = Chat.new()
        self._chats[chat.id] = chat
        self.save(chat)
        self.chats_changed.emit()
        return chat

    def delete(self, chat_id: str) -> None:
        if self._chats.pop(chat_id, None) is not None:
            self.path(chat_id).unlink(missing_ok=True)
            self.chats_changed.emit()

    def save(self, chat: Chat) -> None:
        chat.updated = time.time()
        if chat.title == "New chat":
            first = next((_named(t) for t in chat.turns if t.role == "user"), "")
            if first.strip():
                chat.title = _title(first, 40)
        self._write(chat)

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

    def set_system_prompt(self, chat_id: str, prompt: str | None) -> None:
        """The chat's own system prompt (None: the settings' again); its place in the list,
        by last message, stays."""
        chat = self._chats.get(chat_id)
        if chat is not None and chat.system_prompt != prompt:
            chat.system_prompt = prompt
            self._write(chat)

    def set_draft(self, chat_id: str, text: str) -> None:
        """What the chat's message box holds, unsent, kept with the chat (its place in the
        list stays)."""
        chat = self._chats.get(chat_id)
        if chat is not None and chat.draft != text:
            chat.draft = text
            self._write(chat)

    def _write(self, chat: Chat) -> None:
        path = self.path(chat.id)
        if self._chats.get(chat.id) is not chat and path.exists():
            raise ChatFileError(f"{path.name} belongs to another chat; it is not written over")
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(chat.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
        tmp.replace(path)
        self.chat_updated.emit(chat.id)


TITLE_MAX = 80  # characters of a title given by hand


def _named(turn: Turn) -> str:
    """A user turn's text, or its files' names where it has none (a chat's first title)."""
    return turn.content or ", ".join(a.name for a in turn.attachments)


def _title(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    line = " ".join(text.split())
    return line[:limit] + ("…" if len(line) > limit else "")
