"""Saved stream states, so a chat that goes on does not prefill its history again.

After a reply, the stream's state (KV up to its length, conv and recurrent state) is saved
under the exact token ids it holds. A later prompt that starts with those ids restores the
snapshot and prefills only the rest. DeltaNet state cannot be cut back to an earlier token, so
only an exact prefix match is reused; anything else starts fresh, which gives the same tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CacheEntry:
    ids: tuple[int, ...]
    snapshot: Any
    nbytes: int


class PromptCache:
    """Least-recently-used snapshots, bounded by a byte budget (from the memory plan)."""

    def __init__(self, budget_bytes: int, on_evict: Callable[[Any], None] | None = None):
        self.budget_bytes = max(0, int(budget_bytes))
        self.on_evict = on_evict  # frees a snapshot's memory (device snapshots)
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

    def make_room(self, nbytes: int) -> bool:
        """Evict the oldest snapshots until `nbytes` more fit the budget; False if they never
        can. Called before a snapshot is taken, so the cache never holds more than its budget."""
        if nbytes > self.budget_bytes:
            return False
        while self._entries and self.held_bytes + nbytes > self.budget_bytes:
            self._evict(next(iter(self._entries)))
        return True

    def store(self, ids: list[int], snapshot: Any, nbytes: int) -> bool:
        """Keep a snapshot, evicting the oldest ones to stay in budget; False if it cannot fit
        (the caller still owns the snapshot then)."""
        key = tuple(ids)
        if not key or not self.make_room(nbytes):
            return False
        if key in self._entries:
            self._evict(key)
        self._entries[key] = CacheEntry(key, snapshot, nbytes)
        return True

    def _evict(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        if self.on_evict is not None:
            self.on_evict(entry.snapshot)

    def clear(self) -> None:
        while self._entries:
            self._evict(next(iter(self._entries)))
