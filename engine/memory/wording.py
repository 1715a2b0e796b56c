"""How a plan's numbers read in the verdict's sentences: sizes, and what caps the room.

`snug plan`, the load panel and the Models list show these sentences as admission writes
them (engine.memory.admission), and CPU mode's verdict (app.state.host_fit) shares them.
"""

from __future__ import annotations

from engine.config import GIB, EngineSettings


def gib_text(n: int) -> str:
    """Bytes for a sentence: GiB to two places, or MiB (or bytes) where that would read 0 for
    a size that is not (a shortfall of a few MiB is not "0 GiB")."""
    if 0 < abs(n) < GIB // 200:
        mib = f"{n / 2**20:.1f}".rstrip("0").rstrip(".")
        return f"{mib} MiB" if mib not in ("0", "-0") else f"{n:,} bytes"
    return f"{n / GIB:,.2f}".rstrip("0").rstrip(".") + " GiB"


def context_cap_text(asked: int, top: int) -> str:
    """Why a context is planned shorter than asked: the model's own limit (a load holds the
    context to it too)."""
    return (
        f"the context setting asks for {asked:,} tokens, past this model's limit of {top:,}, "
        f"so it is planned at {top:,}"
    )


def can_give(s: EngineSettings, held: int, card_free: int) -> str:
    """What caps the room: the memory limit where it is below the card's free bytes."""
    if s.limit_bytes is not None and s.limit_bytes - held < card_free:
        return f"the {gib_text(s.limit_bytes)} memory limit allows"
    return "this card can give"


def reserve_takes_all(s: EngineSettings, held: int, card_free: int, available: int) -> str:
    """Where the reserve leaves nothing of `available` (what the card, or the limit, gives):
    "; the 5 GiB memory reserve takes all of the card's 4 GiB free", naming the setting to
    change (the reserve or the limit, not the model); else ""."""
    if s.reserve_bytes == 0 or s.reserve_bytes < available:
        return ""
    if s.limit_bytes is not None and s.limit_bytes - held < card_free:
        of = f"the {gib_text(s.limit_bytes)} memory limit"
    else:
        of = f"the card's {gib_text(card_free)} free"
    return f"; the {gib_text(s.reserve_bytes)} memory reserve takes all of {of}"
