"""Each message keeps when it was sent: shown beside its author, kept in the chat file (an
older file without it reads as before), in the Markdown export, and with each reply that
Regenerate keeps."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from fake_engine import FakeEngine

from app.dates import message_time
from app.engine_bridge import LoadRequest
from app.state.chat_history import ChatFileError, Turn
from app.state.chat_store import ChatStore


def test_a_time_reads_short_today_with_its_day_before_and_its_year_another_year():
    now = datetime(2026, 12, 5, 18, 0)
    at = datetime(2026, 12, 5, 9, 7).timestamp()
    assert message_time(at, now) == ("09:07", "5 December 2026, 09:07")
    at = datetime(2026, 3, 14, 23, 41).timestamp()
    assert message_time(at, now) == ("14 Mar, 23:41", "14 March 2026, 23:41")
    at = datetime(2025, 12, 31, 0, 0).timestamp()
    assert message_time(at, now) == ("31 Dec 2025, 00:00", "31 December 2025, 00:00")


def test_a_turns_time_is_kept_in_its_file_and_checked():
    turn = Turn("user", "hi")
    again = Turn.from_dict(json.loads(json.dumps(turn.to_dict())), "turns[0]")
    assert again.sent == turn.sent and again == turn
    older = Turn.from_dict({"role": "user", "content": "hi"}, "turns[0]")
    assert older.sent is None and "sent" not in older.to_dict()  # written back as it was
    with pytest.raises(ChatFileError, match=r"turns\[0\]\.sent"):
        Turn.from_dict({"role": "user", "content": "hi", "sent": "noon"}, "turns[0]")


def _load(qtbot, window):
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 4096))


def test_messages_show_when_they_were_sent_and_a_kept_reply_keeps_its_own(
    qtbot, make_window, chats_dir
):
    loader = FakeEngine.loader(script=["Paris."])
    window = make_window(loader=loader)
    _load(qtbot, window)
    chats = window.ctx.chats
    before = time.time()
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        chats.send("Capital of France?")
    asked, reply = chats.current.turns
    first = reply.sent
    assert before <= asked.sent <= first <= time.time()
    widgets = window.chat.message_widgets()
    short, full = message_time(asked.sent, datetime.now())
    assert widgets[0].sent_label.text() == short and not widgets[0].sent_label.isHidden()
    assert widgets[0].sent_label.toolTip() == f"Sent {full}"
    assert widgets[1].sent_label.toolTip().startswith("Replied ")
    time.sleep(0.01)
    loader.made[-1].script = ["Paris, France."]
    with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
        window.chat.regen_button.click()
    reply = chats.current.turns[-1]
    assert reply.sent > first and reply.others[0].sent == first
    window.chat.message_widgets()[-1].prev_reply.click()  # the first reply, its own time
    qtbot.waitUntil(lambda: chats.current.turns[-1].content == "Paris.", timeout=2000)
    assert chats.current.turns[-1].sent == first
    assert chats.current.turns[-1].others[0].sent > first
    shown = message_time(first, datetime.now())[0]
    qtbot.waitUntil(lambda: window.chat.message_widgets()[-1].sent_label.text() == shown)
    # Kept across a restart; a chat file from before the times shows none.
    chat_id = chats.current.id
    assert ChatStore(chats_dir).get(chat_id).turns[-1].sent == first
    raw = json.loads((chats_dir / f"{chat_id}.json").read_text("utf-8"))
    for turn in raw["turns"]:
        turn.pop("sent")
        for other in turn.get("others", []):
            other.pop("sent")
    (chats_dir / "old.json").write_text(json.dumps({**raw, "id": "old"}), "utf-8")
    again = make_window()
    again.ctx.chats.select("old")
    assert all(w.sent_label.isHidden() for w in again.chat.message_widgets())
    assert "**You**\n" in again.ctx.chats.current.markdown()  # no time where none was kept
