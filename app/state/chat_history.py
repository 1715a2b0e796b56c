"""Chats and their file format: one JSON file per chat (app/state/chat_store.py keeps
the folder of them).

A chat's id is its file name (`<id>.json`), so ids are checked against CHAT_ID before any
path is built. A file that does not hold a valid chat (bad JSON, wrong shape, an id that is
not its file name) raises ChatFileError naming the field. Fields this version does not know
(a newer version's) are kept and written back as they were.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from app.dates import message_time
from app.thinking import split_reply
from engine.attachments import Attachment, compose

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
    # When it was sent (a reply: when it was asked for), seconds since the epoch; None in a
    # chat file written before the time was kept.
    sent: float | None = field(default_factory=time.time, compare=False)

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
            **({"sent": self.sent} if self.sent is not None else {}),
        }

    def holds(self, query: str) -> bool:
        """Whether its text or one of its files' names holds `query` (casefolded already):
        what the chat search finds. A reply's text is what it shows, its thinking and its
        answer, without the tags that set the thinking apart."""
        return any(query in part.casefold() for part in self.shown_text()) or any(
            query in a.name.casefold() for a in self.attachments
        )

    def shown_text(self) -> tuple[str, ...]:
        """The text a message shows: a reply's thinking and its answer, another's content."""
        if self.role != "assistant":
            return (self.content,)
        split = split_reply(self.content, self.thinking_enabled)
        return (split.thinking, split.answer)

    @property
    def prompt(self) -> str:
        """What the model reads of the turn: its attached files, then its text."""
        return compose(self.content, self.attachments)

    @classmethod
    def from_dict(cls, raw: object, where: str) -> Turn:
        keys = ("role", "content", "thinking_enabled", "stats", "attachments", "others", "shown")
        keys += ("sent",)
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
            sent=None if raw.get("sent") is None else _seconds(raw["sent"], f"{where}.sent"),
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
    pinned: bool = False  # listed first, under "Pinned", whatever its age

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
            "pinned": self.pinned,
        }

    @classmethod
    def from_dict(cls, raw: object) -> Chat:
        """A chat from its JSON form; ChatFileError names the first field that is wrong."""
        keys = ("id", "title", "created", "updated", "turns", "system_prompt", "draft")
        keys += ("draft_files", "pinned")
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
            pinned=_flag(raw.get("pinned", False), "pinned"),
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
        now = datetime.now()
        for turn in self.turns:
            when = "" if turn.sent is None else f" ({message_time(turn.sent, now)[1]})"
            if turn.role == "assistant":
                split = split_reply(turn.content, turn.thinking_enabled)
                parts.append(f"**Snug**{when}")
                if split.thinking:
                    parts.append(
                        f"<details><summary>Thought</summary>\n\n{split.thinking}\n\n</details>"
                    )
                if split.answer:  # none where it was stopped while it thought
                    parts.append(split.answer)
            else:
                parts.append(("**You**" if turn.role == "user" else "**Engine error**") + when)
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


def _flag(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ChatFileError(f"{where} is {_short(value)}, not true/false")
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
