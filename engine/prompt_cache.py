"""Saved stream states, so a chat that goes on does not prefill its history again.

After a reply, the stream's state (KV up to its length, conv and recurrent state) is saved
under the exact token ids it holds. A later prompt that starts with those ids restores the
snapshot and prefills only the rest. DeltaNet state cannot be cut back to an earlier token, so
only an exact prefix match is reused; anything else starts fresh, which gives the same tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CacheEntry:
    ids: tuple[int, ...]
    snapshot: Any
    nbytes: int


class PromptCache:
    """Least-recently-used snapshots, bounded by a byte budget (from the memory plan)."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: OrderedDict[tuple[int, ...], CacheEntry] = OrderedDict()

    @property
    def held_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int]) -> CacheEntry | None:
        """The longest saved state whose ids are a proper prefix of `prompt` (one token at
        least must remain to produce logits)."""
        best = None
        for key, entry in self._entries.items():
            if len(key) < len(prompt) and tuple(prompt[: len(key)]) == key:
                if best is None or len(key) > len(best.ids):
                    best = entry
        if best is not None:
            self._entries.move_to_end(best.ids)
        return best

    def store(self, ids: list[int], snapshot: Any, nbytes: int) -> bool:
        """Keep a snapshot, evicting the oldest ones to stay in budget; False if it cannot fit."""
        key = tuple(ids)
        if nbytes > self.budget_bytes or not key:
            return False
        self._entries.pop(key, None)
        while self._entries and self.held_bytes + nbytes > self.budget_bytes:
            self._entries.popitem(last=False)
        self._entries[key] = CacheEntry(key, snapshot, nbytes)
        return True

    def clear(self) -> None:
        self._entries.clear()
