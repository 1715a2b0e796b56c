"""A chat's title cut to its length (40 characters taken from the first message, 80 typed
by hand) is cut between two characters as the reader sees them: a flag, a family emoji or
a letter with its accent is kept whole or left out whole, never halved into another sign."""

from __future__ import annotations

from app.state.chat_history import Turn
from app.state.chat_store import TITLE_MAX, TITLE_MAX_AUTO, ChatStore

FLAG = "\U0001f1eb\U0001f1f7"  # France: two regional indicators, one sign
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # man, woman, girl: one sign
ACCENTED = "e\u0301"  # e and a combining acute accent: é


def _titled(store: ChatStore, first: str) -> str:
    chat = store.create()
    chat.turns.append(Turn("user", first))
    store.save(chat)
    return chat.title


def test_a_title_is_never_cut_inside_a_character(qtbot, chats_dir):
    store = ChatStore(chats_dir)
    pad = "a" * (TITLE_MAX_AUTO - 1)
    for sign in (FLAG, FAMILY, ACCENTED):
        title = _titled(store, pad + sign + " and more words after it")
        assert title == pad + "…", repr(title)  # the sign did not fit whole: left out
    assert _titled(store, "b" * (TITLE_MAX_AUTO - 2) + FLAG + " x") == "b" * 38 + FLAG + "…"
    assert _titled(store, "Trip to Paris " + FLAG) == "Trip to Paris " + FLAG  # short: whole
    chat = store.create()
    typed = "c" * (TITLE_MAX - 1) + ACCENTED + "d"
    assert store.rename(chat.id, typed) == "c" * (TITLE_MAX - 1) + "…"
    # A single sign longer than the limit (a letter under many accents) is cut as before,
    # not to nothing.
    heavy = "z" + "\u0301" * (TITLE_MAX_AUTO + 5)
    assert _titled(store, heavy) == heavy[:TITLE_MAX_AUTO] + "…"
