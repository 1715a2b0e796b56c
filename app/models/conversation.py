"""ChatController: joins the chat store, the settings and the engine controller.

The chat panel and sidebar talk to this object only. It turns a user message into an
engine request, appends streamed text to the reply, and records stats or errors.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app import engine_bridge
from app.models.chat_history import Chat, ChatStore, Turn
from app.models.settings import AppSettings
from app.workers.engine_worker import EngineController


class ChatController(QObject):
    current_changed = Signal(str)  # chat id
    turns_changed = Signal(str)  # whole chat must be redrawn
    reply_grew = Signal(str, str)  # chat id, full reply text so far
    busy_changed = Signal(bool)
    notice = Signal(str)  # a short status line (stats or error)

    def __init__(
        self,
        store: ChatStore,
        engine: EngineController,
        settings: AppSettings,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.engine = engine
        self.settings = settings
        self._current: str | None = None
        self._request: int | None = None
        self._reply_chat: str | None = None
        engine.tokens.connect(self._on_tokens)
        engine.finished.connect(self._on_finished)
        engine.failed.connect(self._on_failed)
        chats = store.chats()
        self.select(chats[0].id if chats else store.create().id)

    # -- queries
    @property
    def current(self) -> Chat:
        chat = self.store.get(self._current or "")
        if chat is None:
            chat = self.store.create()
            self._current = chat.id
        return chat

    @property
    def busy(self) -> bool:
        return self._request is not None

    def can_send(self) -> bool:
        return self.engine.state in ("ready", "generating")

    # -- commands
    def select(self, chat_id: str) -> None:
        if self.store.get(chat_id) is None or chat_id == self._current:
            return
        self._current = chat_id
        self.current_changed.emit(chat_id)

    def new_chat(self) -> None:
        chat = self.current
        if not chat.turns:  # reuse an empty chat instead of piling them up
            self.current_changed.emit(chat.id)
            return
        self.select(self.store.create().id)

    def delete_chat(self, chat_id: str) -> None:
        if chat_id == self._reply_chat:
            self.stop()
        self.store.delete(chat_id)
        if chat_id == self._current:
            chats = self.store.chats()
            self._current = None
            self.select(chats[0].id if chats else self.store.create().id)

    def send(self, text: str) -> bool:
        text = text.strip()
        if not text:
            return False
        if not self.can_send():
            self.notice.emit("Load a model first (Models tab, then Load).")
            return False
        chat = self.current
        chat.turns.append(Turn("user", text))
        self._start_reply(chat)
        return True

    def regenerate(self) -> bool:
        """Drop the last reply (and any error after it) and ask again."""
        chat = self.current
        if not self.can_send() or not any(t.role == "user" for t in chat.turns):
            return False
        while chat.turns and chat.turns[-1].role != "user":
            chat.turns.pop()
        self._start_reply(chat)
        return True

    def stop(self) -> None:
        self.engine.stop()

    # -- engine side
    def _start_reply(self, chat: Chat) -> None:
        thinking = self.settings.thinking
        messages = chat.messages(self.settings.system_prompt)
        chat.turns.append(Turn("assistant", "", thinking_enabled=thinking))
        self.store.save(chat)
        self.turns_changed.emit(chat.id)
        params = engine_bridge.make_params(self.settings.sampling())
        self._reply_chat = chat.id
        self._request = self.engine.send(messages, params, thinking)
        self.notice.emit("Generating… (Esc stops)")
        self.busy_changed.emit(True)

    def _reply_turn(self, request_id: int) -> tuple[Chat, Turn] | None:
        if request_id != self._request or self._reply_chat is None:
            return None
        chat = self.store.get(self._reply_chat)
        if chat is None or not chat.turns or chat.turns[-1].role != "assistant":
            return None
        return chat, chat.turns[-1]

    def _on_tokens(self, request_id: int, text: str) -> None:
        found = self._reply_turn(request_id)
        if found is not None:
            chat, turn = found
            turn.content += text
            self.reply_grew.emit(chat.id, turn.content)

    def _on_finished(self, request_id: int, summary: dict) -> None:
        found = self._reply_turn(request_id)
        if found is None:
            return
        chat, turn = found
        turn.stats = {k: v for k, v in summary.items() if v is not None}
        self._end(chat)
        self.notice.emit(format_stats(turn.stats))

    def _on_failed(self, request_id: int, cls: str, msg: str) -> None:
        found = self._reply_turn(request_id)
        if found is None:
            return
        chat, turn = found
        if not turn.content:
            chat.turns.pop()
        chat.turns.append(Turn("error", f"{cls}: {msg}"))
        self._end(chat)
        self.notice.emit(f"The engine refused this reply ({cls}). The model stays loaded.")

    def _end(self, chat: Chat) -> None:
        self._request, self._reply_chat = None, None
        self.store.save(chat)
        self.turns_changed.emit(chat.id)
        self.busy_changed.emit(False)


def format_stats(stats: dict) -> str:
    """'42 tokens · 31.5 tok/s · first token 0.21 s' (parts missing from stats are left out)."""
    parts = []
    if stats.get("new_tokens") is not None:
        parts.append(f"{stats['new_tokens']} tokens")
    if stats.get("decode_tok_s"):
        parts.append(f"{stats['decode_tok_s']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"first token {stats['ttft_s']:.2f} s")
    if stats.get("finish_reason") == "cancelled":
        parts.append("stopped")
    elif stats.get("finish_reason") == "length":
        parts.append("hit the token limit")
    return " · ".join(parts)
