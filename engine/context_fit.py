"""A long chat's prompt cut to the model's context: its oldest messages left out (the app's
chat, `snug chat` and the server's Ollama API use it).

A conversation longer than the engine's context is refused by the engine ("the conversation
needs N tokens but the context is M"). A chat goes on instead: the prompt leaves out the
oldest messages, whole turns from the start (the system prompt and the last message stay),
until it takes at most half the context. Half, not just as much as must go: a prompt cut
only as far as it must would change its beginning again at every later turn, and each change
costs a prefill of the whole prompt (the prompt cache matches a prompt's start); cut to half,
it leaves room for this reply and for several turns that keep the same cut (the caller
passes the last prompt's count back) and so reuse its start. The chat on screen keeps every
message; the reply's stats line says how many were left out.

Only an engine that tokenizes here and says its context (`Engine.context`) is fitted; a
remote server's prompt goes as it is. The server's Ollama API cuts a chat the same way
(as Ollama does), only as far as it must.
"""

from __future__ import annotations

from typing import Any


def fit_prompt(
    engine: Any,
    messages: list[dict],
    thinking: bool | None,
    max_new_tokens: int,
    previous: int = 0,
    half: bool = True,
) -> tuple[Any, int]:
    """The prompt for `messages` (`engine.chat_ids`) and how many messages it leaves out.

    Nothing is left out where the prompt and room for the reply (`max_new_tokens`, at most a
    quarter of the context) fit. Else the conversation's last prompt's cut (`previous`
    messages left out after the system prompt) is kept while it fits, so the prompt's start
    and its cached state stay; else the fewest oldest turns go that bring the prompt to
    half the context, or failing that to the context less the reply's room; where not even
    the last turn alone fits (from the last user message on: a tool call's result stays with
    it), the prompt is that turn (with the system prompt), and the engine refuses it by
    name. `half` False: no cut to half the context, only as far as must (a server that keeps
    nothing of a conversation between its requests, as Ollama's API, gains nothing by
    leaving out more)."""
    ids = engine.chat_ids(messages, enable_thinking=thinking)
    context = getattr(engine, "context", None)
    if not isinstance(ids, list) or not isinstance(context, int) or context <= 0:
        return ids, 0
    room = max(1, min(int(max_new_tokens), context // 4))
    if len(ids) + room <= context:
        return ids, 0
    head = 1 if messages and messages[0].get("role") == "system" else 0
    # Cut points: the start of each user message after the first, so what is kept starts
    # with the user's; the last one keeps only the last turn.
    cuts = [i for i in range(head + 1, len(messages)) if messages[i].get("role") == "user"]
    if not cuts:
        return ids, 0
    prompts: dict[int, list[int]] = {}

    def prompt(cut: int) -> list[int]:
        if cut not in prompts:
            kept = messages[:head] + messages[cut:]
            prompts[cut] = engine.chat_ids(kept, enable_thinking=thinking)
        return prompts[cut]

    if previous > 0 and head + previous in cuts and len(prompt(head + previous)) + room <= context:
        return prompt(head + previous), previous
    for limit in (context // 2, context - room) if half else (context - room,):
        if len(prompt(cuts[-1])) > limit:
            continue
        lo, hi = 0, len(cuts) - 1  # the prompt shrinks as the cut moves later
        while lo < hi:
            mid = (lo + hi) // 2
            if len(prompt(cuts[mid])) <= limit:
                hi = mid
            else:
                lo = mid + 1
        return prompt(cuts[lo]), cuts[lo] - head
    return prompt(cuts[-1]), cuts[-1] - head
