"""Split a reply into its thinking part (between <think> and </think>) and its answer."""

from __future__ import annotations

from dataclasses import dataclass

from engine.tokenizer import THINK_CLOSE as CLOSE
from engine.tokenizer import THINK_OPEN as OPEN


@dataclass(frozen=True)
class Split:
    thinking: str
    answer: str
    thinking_done: bool


def split_reply(text: str, thinking_enabled: bool = False) -> Split:
    """Separate thinking from answer; works on partial text while a reply streams.

    With thinking enabled the chat template already opened `<think>` in the prompt, so the
    reply may start inside the thinking block without an opening tag. With it off the
    template closed the block in the prompt, so a stray `</think>` is not a boundary (and is
    dropped from the answer).
    """
    start = text.find(OPEN)
    if start >= 0:
        before, rest = text[:start], text[start + len(OPEN) :]
    elif thinking_enabled:
        before, rest = "", text
    else:
        return Split("", text.replace(CLOSE, "").strip(), True)
    end = rest.find(CLOSE)
    if end < 0:
        return Split(rest.strip(), before.strip(), False)
    thinking = rest[:end].strip()
    answer = (before + rest[end + len(CLOSE) :]).strip()
    return Split(thinking, answer, True)
