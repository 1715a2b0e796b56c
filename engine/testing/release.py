"""A check shared by the CPU and GPU tests: a reply's stream goes back when the reply is let
go, without the garbage collector (the app's worker stops at the final event)."""

from __future__ import annotations

import gc
import sys
from typing import Any


def streams_left_busy(engine: Any, ids: list[int], params: Any) -> list[str]:
    """Replies read to their final event or to their third token, then dropped, with the
    collector off; each read directly and through a wrapper that does not close what it
    wraps. Returns what was left holding a stream: each case, with the types of what
    referred to its reply (empty: every stream went back at once). `engine` has one
    stream."""

    def plain(*args: Any) -> Any:
        for event in engine.generate(*args):  # noqa: UP028 (yield from would close it)
            yield event

    busy = []
    gc.collect()
    gc.disable()
    try:
        for wrap in (engine.generate, plain):
            for stop_at in (None, 2):
                reply = wrap(ids, params)
                for n, event in enumerate(reply):
                    if event.finished or n == stop_at:
                        break
                held = [type(r).__name__ for r in gc.get_referrers(reply) if r is not sys.modules]
                del reply
                if engine._free_slots != [0]:
                    busy.append(f"{wrap.__name__}, stopped at {stop_at}: held by {held}")
                    gc.collect()  # the next case starts with its stream free
    finally:
        gc.enable()
    return busy
