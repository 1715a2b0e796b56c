"""A chat longer than the context: its oldest turns are left out of the prompt, the engine
answers, and the stats line says how many (engine/context_fit.py)."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine

from app.engine_bridge import LoadRequest
from engine.context_fit import fit_prompt


class Words:
    """An engine whose prompt is one id a word, plus 3 a message (its turn markers)."""

    def __init__(self, context):
        self.context = context
        self.asked: list[list[dict]] = []

    def chat_ids(self, messages, enable_thinking=None):
        self.asked.append(messages)
        return [0] * sum(len(m["content"].split()) + 3 for m in messages)


def chat(turns: int, words: int = 10, system: bool = True) -> list[dict]:
    out = [{"role": "system", "content": "be brief"}] if system else []
    for t in range(turns):
        out.append({"role": "user", "content": " ".join([f"q{t}"] * words)})
        out.append({"role": "assistant", "content": " ".join([f"a{t}"] * words)})
    out.append({"role": "user", "content": "last question"})
    return out


def size(messages):
    return sum(len(m["content"].split()) + 3 for m in messages)


def test_a_chat_that_fits_goes_whole():
    engine, messages = Words(1000), chat(5)  # 5 + 130 + 5 = 140 tokens
    ids, left_out = fit_prompt(engine, messages, None, max_new_tokens=256)
    assert left_out == 0 and len(ids) == size(messages) and len(engine.asked) == 1


@pytest.mark.parametrize("system", [True, False])
def test_the_oldest_turns_go_until_the_prompt_takes_half_the_context(system):
    engine, messages = Words(200), chat(20, system=system)  # 525 or 520 tokens
    ids, left_out = fit_prompt(engine, messages, None, max_new_tokens=256)
    head = 1 if system else 0
    kept = messages[:head] + messages[head + left_out :]
    assert len(ids) == size(kept) <= 100  # half the context
    assert left_out % 2 == 0 and kept[head]["role"] == "user"  # whole turns, from the start
    assert kept[-1]["content"] == "last question"
    if system:
        assert kept[0]["role"] == "system"
    one_fewer = messages[:head] + messages[head + left_out - 2 :]
    assert size(one_fewer) > 100  # no more than had to go
    assert len(engine.asked) < 12  # a binary search, not one prompt a turn


def test_a_long_last_message_keeps_room_for_the_reply_or_is_left_to_the_engine():
    engine = Words(200)
    long_last = chat(3)
    long_last[-1] = {"role": "user", "content": " ".join(["w"] * 120)}  # 123 tokens
    ids, left_out = fit_prompt(engine, long_last, None, max_new_tokens=40)
    assert len(ids) == 5 + 26 + 123 and left_out == 4  # over half, under 200 - 40
    too_long = chat(3)
    too_long[-1] = {"role": "user", "content": " ".join(["w"] * 300)}
    ids, left_out = fit_prompt(engine, too_long, None, max_new_tokens=40)
    assert len(ids) == 5 + 303 and left_out == 6  # only the last message: the engine refuses


def test_a_cut_stays_while_it_fits_so_the_prompts_start_stays():
    """Turn after turn, each prompt keeps the last one's cut while it fits: over 40 turns of
    a conversation ten times the context, the cut moves only when the kept part outgrows the
    context again, and every prompt fits."""
    engine, messages, previous = Words(400), [{"role": "system", "content": "be brief"}], 0
    cuts = []
    for t in range(40):
        messages.append({"role": "user", "content": " ".join([f"q{t}"] * 20)})
        ids, previous = fit_prompt(engine, messages, None, max_new_tokens=64, previous=previous)
        assert len(ids) + 64 <= 400
        cuts.append(previous)
        messages.append({"role": "assistant", "content": " ".join([f"a{t}"] * 40)})
    moves = sum(1 for a, b in zip(cuts, cuts[1:], strict=False) if a != b)
    assert cuts[-1] > 0 and moves <= 14, cuts  # about every third turn, not every turn
    assert cuts == sorted(cuts)  # the start only moves forward
    without = []
    for n in range(2, len(messages) + 1, 2):  # the same turns, no cut passed back
        without.append(fit_prompt(Words(400), messages[:n], None, max_new_tokens=64)[1])
    assert sum(1 for a, b in zip(without, without[1:], strict=False) if a != b) >= 2 * moves


def test_a_remote_prompt_goes_as_it_is():
    class Remote:
        def chat_ids(self, messages, enable_thinking=None):
            return ("prompt", tuple(m["content"] for m in messages))

    prompt, left_out = fit_prompt(Remote(), chat(50), None, max_new_tokens=10)
    assert left_out == 0 and len(prompt[1]) == 102


def test_the_app_says_how_many_messages_were_left_out(qtbot, make_window):
    window = make_window(loader=FakeEngine.loader(context=200))
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        window.ctx.engine.load(LoadRequest("/m", window.ctx.settings.engine_settings(), 200))
    chats = window.ctx.chats
    for n in range(10):  # each turn: a 60-character question, a reply of about 90
        with qtbot.waitSignal(window.ctx.engine.finished, timeout=3000):
            chats.send(f"question {n} " + "x" * 50)
    stats = chats.current.turns[-1].stats
    assert len(chats.current.turns) == 20  # the chat keeps every message
    cuts = [t.stats.get("left_out", 0) for t in chats.current.turns if t.role == "assistant"]
    assert cuts[-1] > 0, cuts
    kept = [a for a, b in zip(cuts, cuts[1:], strict=False) if a == b and a > 0]
    assert kept, cuts  # a later prompt kept the last one's cut (the app passes it back)
    status = window.chat.status.text()
    assert "left out to fit the context" in status
    used = stats["prompt_tokens"] + stats["new_tokens"]
    assert status.endswith(f" · {used} of 200 tokens of context") and used <= 200
