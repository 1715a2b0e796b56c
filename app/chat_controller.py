"""The chat on top of the controllers: ChatController joins the chat store, the settings and
the EngineController (app/controllers.py), so that the chat panel and the sidebar talk to
one object: send, regenerate, continue, edit, stop; each reply's text, stats and errors
recorded in its chat. `format_stats` is a reply's stats line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QObject, Signal

from app import engine_bridge
from app.controllers import EngineController
from app.state.chat_history import MAX_CHAT_BYTES, Chat, Turn
from app.state.chat_store import ChatStore
from app.state.settings import AppSettings
from app.thinking import split_reply
from engine.attachments import Attachment
from engine.errors import SnugError
from engine.thinking_budget import rest_of_close

SAVE_EVERY_S = 5.0  # a streaming reply is saved this often, so that a crash keeps it
RATE_EVERY_S = 0.5  # the status line's tokens and rate, while a reply streams
# ... or less often where a save takes long (a chat of many attached files: about 10 ms a
# MB, on this thread): its interval is at least this many times the last save's time, so
# that saving takes at most 2% of the thread the tokens are shown on.
SAVE_SHARE = 50


class ChatController(QObject):
    """Joins the chat store, the settings and the EngineController.

    The chat panel and sidebar talk to this object only. It turns a user message into an
    engine request, appends streamed text to the reply, and records stats or errors.
    """

    current_changed = Signal(str)  # chat id
    turns_changed = Signal(str)  # whole chat must be redrawn
    reply_grew = Signal(str, str)  # chat id, full reply text so far
    busy_changed = Signal(bool)
    notice = Signal(str)  # a short status line (stats or error)
    refused = Signal(str)  # the engine would refuse the request (settings out of range)

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
        self._tokens_before = 0  # a continued reply's tokens before it went on
        self._stats_before: dict = {}  # ... and its stats then
        self._rate_from: tuple[float, int] | None = None  # the reply's first tokens: when, how many
        self._was_shown: int | None = None  # the reply shown before a Regenerate: its place
        self._rate_said = 0.0
        self._saved_at = 0.0  # when the reply under way was last saved (time.monotonic)
        self._save_every = 0.0  # SAVE_SHARE times the last save's seconds
        engine.tokens.connect(self._on_tokens)
        engine.prompt_progress.connect(self._on_prompt_progress)
        engine.finished.connect(self._on_finished)
        engine.failed.connect(self._on_failed)
        store.save_failed.connect(lambda _id, message: self.notice.emit(message))
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

    def can_regenerate(self) -> bool:
        """A model is loaded, nothing is generating, and the chat has a message to answer."""
        chat = self.store.get(self._current or "")
        has_user = chat is not None and any(t.role == "user" for t in chat.turns)
        return self.can_send() and not self.busy and has_user

    def busy_notice(self) -> str:
        """The status line while a reply is generating, said of the chat on show: that
        chat's reply, or the other chat the reply goes to."""
        chat = self.store.get(self._reply_chat or "")
        if chat is None or chat.id == self._current:
            return "Generating… (Esc stops)"
        return f"Answering “{chat.title}”: send once it ends (Esc stops it)."

    # -- commands
    def select(self, chat_id: str) -> None:
        if self.store.get(chat_id) is None or chat_id == self._current:
            return
        self._current = chat_id
        # The status line spoke of the chat left behind; a reply still under way is said.
        self.notice.emit(self.busy_notice() if self.busy else "")
        self.current_changed.emit(chat_id)

    def new_chat(self) -> None:
        chat = self.current
        if not chat.turns:  # reuse an empty chat instead of piling them up
            self.notice.emit(self.busy_notice() if self.busy else "")
            self.current_changed.emit(chat.id)
            return
        self.select(self.store.create().id)

    def branch(self, index: int, draft: Turn | None = None) -> bool:
        """A new chat holding the chat on show up to its message `index` (its system prompt
        too, and a reply's others; -1: none of its messages), shown: the conversation tried
        another way from there, the first kept as it is. `draft`: a message put in the new
        chat's message box, its text and files, to change and send."""
        chat = self.current
        if not -1 <= index < len(chat.turns) or (self.busy and self._reply_chat == chat.id):
            return False
        copy = self.store.create()
        copy.turns = [Turn.from_dict(t.to_dict(), "turn") for t in chat.turns[: index + 1]]
        copy.system_prompt = chat.system_prompt
        self.store.rename(copy.id, f"{chat.title} (branch)")  # written with its turns
        if draft is not None:
            self.store.set_draft(copy.id, draft.content, draft.attachments)
        self.select(copy.id)
        return True

    def edit_earlier(self, index: int) -> bool:
        """Change the chat's message `index`, one of the user's before the last: a branch
        of the chat up to the message before it, shown with the message in its message
        box; the chat itself stays as it is (Edit on the last message changes it in place:
        `edit_last`)."""
        turns = self.current.turns
        if not 0 <= index < len(turns) or turns[index].role != "user":
            return False
        return self.branch(index - 1, draft=turns[index])

    def delete_chat(self, chat_id: str) -> None:
        """Delete the chat; where it is the one on show, the newest other chat (or a new
        one) is shown first, so that nothing ever reads the current chat while it is gone."""
        if chat_id == self._reply_chat:
            self.stop()
        if chat_id == self._current:
            others = [c for c in self.store.chats() if c.id != chat_id]
            self.select(others[0].id if others else self.store.create().id)
        self.store.delete(chat_id)  # where it cannot be, the chat stays and `notice` says

    def send(self, text: str, attachments: Sequence[Attachment] = ()) -> bool:
        """Ask for a reply to `text` (and the files attached, which the model reads first:
        engine/attachments.py); False, with the chat as it was, where nothing was sent."""
        text = text.strip()
        if not text and not attachments:
            return False
        if not self.can_send():
            self.notice.emit("Load a model first (Models tab, then Load).")
            return False
        if self.busy:  # one reply at a time: a send never cuts the one under way
            self.notice.emit(self.busy_notice())
            return False
        params = self._params()
        if params is None:
            return False
        chat, turn = self.current, Turn("user", text, attachments=list(attachments))
        if not self.store.takes(chat.id, turn):
            self.notice.emit(
                f"This chat is too long to take the message: its file would pass the "
                f"{MAX_CHAT_BYTES >> 20} MB a chat may hold. Start a new chat for it "
                "(the message stays in the box)."
            )
            return False
        chat.turns.append(turn)
        self._start_reply(chat, params)
        return True

    def regenerate(self) -> bool:
        """Drop the last reply (and any error after it) and ask again."""
        if not self.can_regenerate():
            return False
        params = self._params()
        if params is None:
            return False
        chat = self.current
        earlier: list[Turn] = []  # the replies to this message so far: they stay, behind it
        self._was_shown = None
        while chat.turns and chat.turns[-1].role != "user":
            gone = chat.turns.pop()
            if gone.role == "assistant":
                replies = all_replies(gone)
                earlier = [t for t in replies if t.content]
                shown = replies[gone.shown]
                self._was_shown = earlier.index(shown) if shown in earlier else None
        self._start_reply(chat, params, earlier)
        return True

    def show_reply(self, index: int) -> bool:
        """Show the last message's reply `index` (0: the first written) of those Regenerate
        kept; the chat goes on from the one shown."""
        chat = self.store.get(self._current or "")
        if chat is None or self.busy or not chat.turns or chat.turns[-1].role != "assistant":
            return False
        turn = chat.turns[-1]
        replies = all_replies(turn)
        if not 0 <= index < len(replies) or index == turn.shown:
            return False
        shown_among(turn, replies, index)
        self.store.save(chat)
        self.turns_changed.emit(chat.id)  # the chat drawn again: Continue follows the reply
        self.notice.emit(self.stats_line(turn.stats))  # the status line speaks of this one
        return True

    def can_continue(self) -> bool:
        """The chat's last reply was cut (the token limit, or stopped) and the model loaded
        can go on with it: one with a tokenizer here, to read the reply so far (not a
        remote server's, nor the demo's)."""
        chat = self.store.get(self._current or "")
        if chat is None or not chat.turns or not self.can_send() or self.busy:
            return False
        last = chat.turns[-1]
        cut = last.stats.get("finish_reason") in ("length", "cancelled")
        readable = self.engine.info.get("tokenizer") is not None
        return last.role == "assistant" and bool(last.content) and cut and readable

    def continue_reply(self) -> bool:
        """Go on with the last reply where it was cut: the prompt it answered, then its text
        so far; what comes is added to it."""
        if not self.can_continue():
            return False
        chat = self.current
        turn = chat.turns[-1]
        params = self._params(turn.thinking_enabled)  # the set it was written with
        if params is None:
            return False
        messages = chat.messages(self.settings.system_prompt)[:-1]
        rest = closing_rest(turn)
        if rest:  # cut by the token limit inside the budget's closing words: they end first
            turn.content += rest
            self.reply_grew.emit(chat.id, turn.content)
        self._tokens_before = int(turn.stats.get("new_tokens") or 0)
        self._stats_before = dict(turn.stats)
        self._rate_from = None
        self._reply_chat = chat.id
        self._saved_at, self._save_every = time.monotonic(), 0.0
        left_out = self._left_out(chat.turns[:-1])
        budget = self.settings.thinking_budget  # what is left of it, where it still thinks
        self._request = self.engine.send(
            messages, params, turn.thinking_enabled, left_out, turn.content, budget
        )
        self.notice.emit("Going on… (Esc stops)")
        self.busy_changed.emit(True)
        return True

    def edit_last(self) -> Turn | None:
        """Take back the chat's last message to change it: it and what came after (the
        reply, an error) leave the chat, and it is returned for the composer (its text and
        files). None while a reply is generating or where the chat has no message of the
        user's."""
        chat = self.store.get(self._current or "")
        if self.busy or chat is None:
            return None
        last = max((i for i, t in enumerate(chat.turns) if t.role == "user"), default=None)
        if last is None:
            return None
        turn = chat.turns[last]
        del chat.turns[last:]
        saved = self.store.save(chat)
        self.turns_changed.emit(chat.id)
        if saved:  # else the status line says the save failed
            self.notice.emit("")
        return turn

    def stop(self) -> None:
        self.engine.stop()

    def close(self) -> None:
        """At exit, once the engine's thread has ended: a reply whose end never came is
        kept as far as it came, as stopped, and saved (else what streamed since its last
        save would be lost, and it would open again as a reply still under way)."""
        if self._request is not None:
            self._on_finished(self._request, {"finish_reason": "cancelled"})

    # -- engine side
    def _params(self, thinking: bool | None = None) -> Any:
        """The request's parameters: the sampling set for a reply that thinks first, or
        for one that does not (`thinking`; None: as the Thinking box says now). None when
        the engine refuses the settings: then the reason is said (`notice`, `refused`) and
        the chat is left as it was."""
        thinking = self.settings.thinking if thinking is None else thinking
        try:
            return engine_bridge.make_params(self.settings.sampling(thinking))
        except (SnugError, ValueError, TypeError) as exc:
            group = "Sampling while thinking" if thinking else "Sampling"
            message = f"Not sent: {exc}. Change it in Settings > {group}."
            self.notice.emit(message)
            self.refused.emit(message)
            return None

    def _start_reply(self, chat: Chat, params: Any, earlier: list[Turn] | None = None) -> None:
        thinking = self.settings.thinking
        messages = chat.messages(self.settings.system_prompt)
        others = list(earlier or [])
        chat.turns.append(Turn("assistant", "", thinking, others=others, shown=len(others)))
        saved = self._timed_save(chat)
        self.turns_changed.emit(chat.id)
        self._reply_chat = chat.id
        self._tokens_before, self._stats_before = 0, {}
        self._rate_from = None
        left_out = self._left_out(chat.turns[:-1])
        budget = self.settings.thinking_budget
        self._request = self.engine.send(messages, params, thinking, left_out, "", budget)
        if saved:  # else the status line says the save failed
            self.notice.emit(self.busy_notice())
        self.busy_changed.emit(True)

    @staticmethod
    def _left_out(turns: list[Turn]) -> int:
        """The messages the last reply's prompt left out (its stats), 0 with none."""
        replies = [t for t in turns if t.role == "assistant"]
        return int(replies[-1].stats.get("left_out", 0)) if replies else 0

    def _reply_turn(self, request_id: int) -> tuple[Chat, Turn] | None:
        if request_id != self._request or self._reply_chat is None:
            return None
        chat = self.store.get(self._reply_chat)
        if chat is None or not chat.turns or chat.turns[-1].role != "assistant":
            return None
        return chat, chat.turns[-1]

    def _on_prompt_progress(self, request_id: int, done: int, total: int) -> None:
        """A long prompt (a chat's history, attached files) says how far it has been read."""
        if request_id == self._request and done < total:
            self.notice.emit(f"Reading the prompt… {done:,} of {total:,} tokens (Esc stops)")

    def _on_tokens(self, request_id: int, text: str, count: int = 0) -> None:
        found = self._reply_turn(request_id)
        if found is not None:
            chat, turn = found
            turn.content += text
            self.reply_grew.emit(chat.id, turn.content)
            self._say_rate(chat, count)
            if time.monotonic() - self._saved_at >= max(SAVE_EVERY_S, self._save_every):
                self._timed_save(chat)  # a crash keeps what came so far

    def _say_rate(self, chat: Chat, count: int) -> None:
        """The status line, while the reply shown streams: its tokens so far and their rate
        (from its first token, so the prompt's reading is not counted), twice a second."""
        now = time.monotonic()
        if self._rate_from is None:
            self._rate_from, self._rate_said = (now, count), now
            return
        start, first = self._rate_from
        if now - self._rate_said < RATE_EVERY_S or chat.id != self._current or now <= start:
            return
        self._rate_said = now
        rate = (count - first) / (now - start)
        self.notice.emit(f"Generating… {count:,} tokens · {rate:.1f} tok/s (Esc stops)")

    def _timed_save(self, chat: Chat) -> bool:
        """Save the chat of the reply under way; the next save while it streams waits
        SAVE_EVERY_S, or SAVE_SHARE times as long as this one took."""
        start = time.monotonic()
        saved = self.store.save(chat)
        self._saved_at = time.monotonic()
        self._save_every = SAVE_SHARE * (self._saved_at - start)
        return saved

    def _on_finished(self, request_id: int, summary: dict) -> None:
        found = self._reply_turn(request_id)
        if found is None:
            self._orphaned(request_id)
            return
        chat, turn = found
        if not turn.content and summary.get("finish_reason") == "cancelled":
            self._take_out(chat, turn)  # stopped before the reply began: no empty reply stays
            if self._end(chat):
                self.notice.emit("Stopped before the reply began (Regenerate asks again).")
            return
        turn.stats = {k: v for k, v in summary.items() if v is not None}
        if self._stats_before:
            went_on(turn.stats, self._stats_before)
        used, context = self._used(turn.stats)
        if turn.stats.get("finish_reason") == "length" and 0 < context <= used:
            turn.stats["filled_context"] = context  # the context's end, not the token limit
        if not self._end(chat):
            return  # the status line says the save failed, and what to do
        if chat.id != self._current:  # its stats are on the reply, in its own chat
            self.notice.emit("")
            return
        self.notice.emit(self.stats_line(turn.stats))

    def stats_line(self, stats: dict) -> str:
        """The status line for a reply's stats: `format_stats`, then the context it used."""
        line, used = format_stats(stats), self.context_used(stats)
        return f"{line} · {used}" if line and used else line or used

    def context_used(self, stats: dict) -> str:
        """'1,240 of 8,192 tokens of context': what the chat's prompt and this reply take of
        the loaded model's context (empty where either is unknown)."""
        used, context = self._used(stats)
        return f"{min(used, context):,} of {context:,} tokens of context" if context else ""

    def _used(self, stats: dict) -> tuple[int, int]:
        """(tokens the prompt and reply take, the loaded context); (0, 0) where unknown. A
        reply that filled the context counts one token past it (its last is never fed)."""
        context = self.engine.info.get("context")
        prompt, new = stats.get("prompt_tokens"), stats.get("new_tokens")
        if not isinstance(context, int) or context <= 0 or prompt is None or new is None:
            return 0, 0
        return int(prompt) + int(new), context

    def _on_failed(self, request_id: int, cls: str, msg: str) -> None:
        found = self._reply_turn(request_id)
        if found is None:
            self._orphaned(request_id)
            return
        chat, turn = found
        if not turn.content:
            self._take_out(chat, turn)
        chat.turns.append(Turn("error", f"{cls}: {msg}"))
        if self._end(chat):
            if cls == "RemoteError":  # a model served elsewhere (app/remote_wire.py)
                self.notice.emit("The server did not finish this reply: the chat says why.")
            else:
                self.notice.emit(f"The engine refused this reply ({cls}). The model stays loaded.")

    def _take_out(self, chat: Chat, turn: Turn) -> None:
        """An empty reply (stopped or refused before its first word) out of the chat; where
        Regenerate started it, the reply shown before comes back in its place, with the
        others it kept."""
        if not turn.others:
            chat.turns.pop()
            return
        back = self._was_shown if self._was_shown is not None else len(turn.others) - 1
        shown_among(turn, turn.others, min(back, len(turn.others) - 1))

    def _orphaned(self, request_id: int) -> None:
        """The reply under way ended with its chat deleted: nothing is generating now."""
        if request_id == self._request:
            self._request, self._reply_chat = None, None
            self.busy_changed.emit(False)

    def _end(self, chat: Chat) -> bool:
        """The reply is over: the chat saved and redrawn. False where the save failed (the
        status line says so)."""
        self._request, self._reply_chat = None, None
        saved = self.store.save(chat)
        self.turns_changed.emit(chat.id)
        self.busy_changed.emit(False)
        return saved


def format_stats(stats: dict) -> str:
    """'42 tokens · 31.5 tok/s · first token 0.21 s · 30 of 40 drafts kept' (parts missing
    from stats are left out)."""
    parts = []
    if stats.get("new_tokens") is not None:
        parts.append(f"{stats['new_tokens']} tokens")
    if stats.get("decode_tok_s"):
        parts.append(f"{stats['decode_tok_s']:.1f} tok/s")
    if stats.get("ttft_s") is not None:
        parts.append(f"first token {stats['ttft_s']:.2f} s")
    if stats.get("drafted"):  # drafting with the MTP head: how many of its drafts paid
        kept, drafted = int(stats.get("drafts_kept") or 0), int(stats["drafted"])
        parts.append(f"{kept} of {drafted} drafts kept")
    if stats.get("thinking_cut"):  # the thinking budget closed it (engine/thinking_budget.py)
        parts.append(f"thinking closed at its budget of {int(stats['thinking_cut']):,} tokens")
    if stats.get("left_out"):  # the chat outgrew the context (engine/context_fit.py)
        n = int(stats["left_out"])
        parts.append(f"{n} earlier message{'' if n == 1 else 's'} left out to fit the context")
    if stats.get("finish_reason") == "cancelled":
        parts.append("stopped")
    elif stats.get("finish_reason") == "length" and stats.get("filled_context"):
        parts.append("filled the context (a larger one on the Load tab makes room)")
    elif stats.get("finish_reason") == "length":
        parts.append("hit the token limit")
    return " · ".join(parts)


def went_on(stats: dict, before: dict) -> None:
    """`stats`, a continued reply's last part's, made the whole reply's from `before` (its
    stats when Continue was pressed): its tokens all counted; the prompt the reply answered,
    without the reply so far that the engine read after it (else the context it used would
    count those tokens twice); how long it thought and the budget that closed its thinking,
    where that happened before it went on."""
    if "new_tokens" not in stats:  # stopped before its first token: the reply as it was
        for key, value in before.items():
            stats.setdefault(key, value)
        return
    earlier = int(before.get("new_tokens") or 0)
    stats["new_tokens"] += earlier
    if "prompt_tokens" in stats:
        stats["prompt_tokens"] = max(0, int(stats["prompt_tokens"]) - earlier)
    for key in ("thinking_s", "thinking_cut"):
        if before.get(key) and not stats.get(key):
            stats[key] = before[key]


def closing_rest(turn: Turn) -> str:
    """The rest of the thinking budget's closing words, where the reply was cut by the token
    limit while they were put in (its thinking closed at the budget and still open); ""
    else. Continue puts them in first, so the thinking closes once and the answer follows."""
    if not turn.stats.get("thinking_cut") or split_reply(turn.content, True).thinking_done:
        return ""
    return rest_of_close(turn.content)


def shown_among(turn: Turn, replies: list[Turn], index: int) -> None:
    """`turn` made the reply `replies[index]`, the others kept with it."""
    pick = replies[index]
    turn.content, turn.thinking_enabled, turn.stats, turn.sent = (
        pick.content,
        pick.thinking_enabled,
        pick.stats,
        pick.sent,
    )
    turn.others, turn.shown = replies[:index] + replies[index + 1 :], index


def all_replies(turn: Turn) -> list[Turn]:
    """A reply and the others Regenerate kept with it, in the order they were written (each
    alone: no others of its own)."""
    this = Turn(turn.role, turn.content, turn.thinking_enabled, dict(turn.stats), sent=turn.sent)
    return turn.others[: turn.shown] + [this] + turn.others[turn.shown :]
