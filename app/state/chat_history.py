"""Chats and their storage: one JSON file per chat in AppDataLocation/chats.

A chat's id is its file name (`<id>.json`), so ids are checked against CHAT_ID before any
path is built, and every path is checked to lie inside the chats folder. A file that does
not hold a valid chat (bad JSON, wrong shape, an id that is not its file name) is reported
in `ChatStore.problems` and the log, skipped, and never written over. Fields this version
does not know (a newer version's) are kept and written back as they were.

A save writes `<id>.tmp` and renames it over `<id>.json`, so a save cut short leaves the
previous file whole; the next start finishes or drops the `.tmp` it left. A save that fails
(a full or read-only disk) keeps the chat in memory, says so (`save_failed`), and is tried
again with the next save.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import reprlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QStandardPaths, Signal

from app.thinking import split_reply
from engine.attachments import Attachment, compose

log = logging.getLogger(__name__)
CHAT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
ROLES = ("user", "assistant", "error")
MAX_CHAT_BYTES = 64 << 20  # far above any real conversation; bounds the time a load takes
# Room kept in a chat's file for the reply to a message: one at the models' largest context
# (262,144 tokens, about 1 MB of text, its thinking too) with room to spare.
REPLY_BYTES = 8 << 20


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
    extra: dict = field(default_factory=dict, compare=False)  # fields of a newer version
    # A reply's other replies to the same message (Regenerate keeps them, in the order they
    # were written), and this one's place among them all (app/chat_controller.py).
    others: list[Turn] = field(default_factory=list)
    shown: int = 0

    def to_dict(self) -> dict:
        return {
            **self.extra,
            "role": self.role,
            "content": self.content,
            "thinking_enabled": self.thinking_enabled,
            "stats": dict(self.stats),
            "attachments": [{"name": a.name, "text": a.text} for a in self.attachments],
            **(
                {"others": [t.to_dict() for t in self.others], "shown": self.shown}
                if self.others
                else {}
            ),
        }

    @property
    def prompt(self) -> str:
        """What the model reads of the turn: its attached files, then its text."""
        return compose(self.content, self.attachments)

    @classmethod
    def from_dict(cls, raw: object, where: str) -> Turn:
        keys = ("role", "content", "thinking_enabled", "stats", "attachments", "others", "shown")
        raw = _object(raw, where, keys)
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
            extra=_extra(raw, keys, where),
            **_others(raw, where),
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
    extra: dict = field(default_factory=dict, compare=False)  # fields of a newer version
    draft_files: list[Attachment] = field(default_factory=list)  # files attached, unsent

    @classmethod
    def new(cls) -> Chat:
        return cls(id=uuid.uuid4().hex[:12])

    def to_dict(self) -> dict:
        return {
            **self.extra,
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "turns": [t.to_dict() for t in self.turns],
            "system_prompt": self.system_prompt,
            "draft": self.draft,
            "draft_files": [{"name": a.name, "text": a.text} for a in self.draft_files],
        }

    @classmethod
    def from_dict(cls, raw: object) -> Chat:
        """A chat from its JSON form; ChatFileError names the first field that is wrong."""
        keys = ("id", "title", "created", "updated", "turns", "system_prompt", "draft")
        keys += ("draft_files",)
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
            draft_files=_attachments(raw.get("draft_files", []), "draft_files"),
            extra=_extra(raw, keys, "the file"),
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
    "thinking_cut",  # the budget the thinking was closed at (engine/thinking_budget.py)
    "thinking_s",  # seconds the reply thought, from its first token (app/workers)
)


def _short(value: object) -> str:
    return reprlib.repr(value)  # bounded: long strings, numbers and nesting are cut


def _object(raw: object, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(raw, dict):
        raise ChatFileError(f"{where} is {_short(raw)}, not an object")
    return raw


def _extra(raw: dict, keys: tuple[str, ...], where: str) -> dict:
    """The fields of `raw` not in `keys` (a newer version's), kept to be written back; they
    must be writable as they are."""
    extra = {k: v for k, v in raw.items() if k not in keys}
    try:
        json.dumps(extra, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):  # a lone surrogate, nesting too deep to write
        raise ChatFileError(f"{where} has a field that cannot be saved again") from None
    return extra


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


def _others(raw: dict, where: str) -> dict:
    """A reply's other replies and its place among them, checked."""
    others, shown = raw.get("others", []), raw.get("shown", 0)
    if not isinstance(others, list):
        raise ChatFileError(f"{where}.others is {_short(others)}, not a list")
    if isinstance(shown, bool) or not isinstance(shown, int) or not 0 <= shown <= len(others):
        raise ChatFileError(f"{where}.shown is {_short(shown)}, not 0 to {len(others)}")
    turns = [Turn.from_dict(t, f"{where}.others[{i}]") for i, t in enumerate(others)]
    for turn in turns:
        turn.others, turn.shown = [], 0  # one level: the replies of one message
    return {"others": turns, "shown": shown}


def _attachments(raw: object, where: str) -> list[Attachment]:
    if not isinstance(raw, list):
        raise ChatFileError(f"{where} is {_short(raw)}, not a list")
    out = []
    for i, item in enumerate(raw):
        item = _object(item, f"{where}[{i}]", ("name", "text"))
        unknown = [k for k in item if k not in ("name", "text")]
        if unknown:
            raise ChatFileError(f"{where}[{i}] has unknown field {_short(unknown[0])}")
        name = _text(item.get("name"), f"{where}[{i}].name")
        out.append(Attachment(name, _text(item.get("text"), f"{where}[{i}].text")))
    return out


def read_chat(path: Path, expect_id: str | None = None) -> Chat:
    """The chat stored in `path` (whose id is `expect_id`, else the file's name);
    ChatFileError, naming the file and what is wrong with it, for anything else."""
    try:
        if path.is_dir():
            raise ChatFileError("it is a folder, not a file")
        size = path.stat().st_size
        if size > MAX_CHAT_BYTES:
            raise ChatFileError(
                f"it is {size / 2**20:,.0f} MB, more than the {MAX_CHAT_BYTES >> 20} MB "
                "a chat file may hold"
            )
        if size == 0:
            raise ChatFileError("it is empty (a save cut short?)")
        chat = Chat.from_dict(json.loads(path.read_bytes()))
    except ChatFileError as exc:
        raise ChatFileError(f"{path.name}: {exc}") from None
    except FileNotFoundError:  # a link to a file that is gone
        raise ChatFileError(f"{path.name}: it leads to a file that is not there") from None
    except OSError as exc:
        raise ChatFileError(f"{path.name}: it cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ChatFileError(
            f"{path.name}: it is cut short or damaged, not a whole chat ({exc.msg} at "
            f"character {exc.pos:,})"
        ) from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, nested too deep
        text = str(exc)[:120]
        raise ChatFileError(f"{path.name}: {type(exc).__name__}: {text}") from None
    if chat.id != (expect_id or path.stem):
        raise ChatFileError(f"{path.name}: the id {chat.id!r} is not the file's name")
    return chat


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
        return self._sizes.get(chat_id, 0) + added + REPLY_BYTES <= MAX_CHAT_BYTES

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
        if len(data) > MAX_CHAT_BYTES and chat.draft_files:  # past what a start reads back:
            unsent = {**chat.to_dict(), "draft_files": []}  # the unsent files stay in memory
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
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    line = " ".join(text.split())
    return line[:limit] + ("…" if len(line) > limit else "")
