"""Saved stream states, so a chat that goes on does not prefill its history again.

At the end of each prompt's prefill and of each reply, the stream's state (KV up to its
length, conv and recurrent state) is saved under the exact token ids it holds. A later
prompt that starts with those ids restores the snapshot and prefills only the rest; the
prefill's chunks fall at the same absolute positions either way, so the state is the one an
uninterrupted run has (invariant 6). DeltaNet state cannot be cut back to an earlier token,
so only an exact prefix match is reused; anything else starts fresh, with the same tokens.

Three tiers, each least-recently-used within its own byte budget:

    device   the backend's own snapshots (a pool block on the card, or pinned host memory
             where the plan put them there; numpy arrays on the numpy backend)
    host     HostSnapshots: host numpy arrays (pinned on CUDA), `host_cache_bytes`
    disk     engine.snapshot_store in the app's data folder, `disk_cache_bytes`

A snapshot evicted from a faster tier moves down where the lower tier has room, and one too
large for the device tier goes to the host tier. The disk copy is written when the snapshot
is taken, by a writer thread (the engine thread converts it to host arrays first: no copy
for host memory, one for a device block), so a crash or a restart keeps the conversation.
A restore takes the longest matching snapshot from whichever tier has it (the fastest on a
tie); one that does not check out is refused with a logged reason, and the prompt is
prefilled afresh. A restore from disk reads the file into the buffer the backend lends
(`host_buffer`: its spare pinned memory on CUDA, readied off a reply's path), which goes
back once the slot holds the state (the state stays on disk, not in the host tier, so the
pinned memory held is that one buffer and the host tier's budget); where none is lent, the
store's own buffer goes to the host tier.

A prompt sent again whole (Regenerate, several replies to one prompt, a client's retry)
extends no saved state by a token, so the longest prefix would leave its last turn to read
again. For the last END_LOGITS prompts whose state was saved at their end, the logits of
their last token are kept in host memory beside it (about 1 MB each at Qwen3.5's
vocabulary): `restore_end` puts such a state into the slot and hands back those logits, and
the reply's first token is picked with no forward at all. They are the logits the prompt's
own prefill computed from the same state, so the reply is the one a fresh read gives
(invariant 6). They are not written to disk: after a restart the last turn is read again.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import DeviceOutOfMemory
from engine.snapshot_store import (
    HostSnapshot,
    SnapshotMismatch,
    SnapshotStore,
    StoreKey,
    entry_name,
    model_fingerprint,
)
from engine.snapshot_writer import DiskWriter

log = logging.getLogger(__name__)

TIERS = ("device", "host", "disk")
# A request saves its stream's state at most twice before its reply ends (its prompt's turn
# start, its first token: `Engine.prefill`, `Engine.generate`), each save evicting the oldest
# device snapshots where the tier is full: buffers for what that many saves, each the size of
# the last one and NEXT_TURN_TOKENS more, would move are pinned ahead.
MOVES_AHEAD = 2
NEXT_TURN_TOKENS = 256  # the next turn's states, over the last: a user's message and headers
END_LOGITS = 8  # prompts whose last token's logits are kept beside their prompt-end state


@dataclass(frozen=True)
class CacheEntry:
    ids: tuple[int, ...]
    snapshot: Any
    nbytes: int


class PromptCache:
    """One tier: least-recently-used snapshots, bounded by a byte budget.

    `on_evict(snapshot)` frees an evicted snapshot's memory; `move_down(entry)`, called
    first, may hand it to a lower tier. `clear` drops without moving down."""

    def __init__(
        self,
        budget_bytes: int,
        on_evict: Callable[[Any], None] | None = None,
        move_down: Callable[[CacheEntry], None] | None = None,
    ):
        self.budget_bytes = max(0, int(budget_bytes))
        self.on_evict = on_evict
        self.move_down = move_down
        self._entries: OrderedDict[tuple[int, ...], CacheEntry] = OrderedDict()

    @property
    def held_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, ids: tuple[int, ...]) -> bool:
        return ids in self._entries

    def lookup(self, prompt: list[int], touch: bool = True) -> CacheEntry | None:
        """The longest saved state whose ids are a proper prefix of `prompt` (one token at
        least must remain to produce logits)."""
        best = None
        for key, entry in self._entries.items():
            if len(key) < len(prompt) and tuple(prompt[: len(key)]) == key:
                if best is None or len(key) > len(best.ids):
                    best = entry
        if best is not None and touch:
            self._entries.move_to_end(best.ids)
        return best

    def victims(self, nbytes: int, saves: int) -> list[CacheEntry]:
        """The entries that `saves` snapshots of `nbytes` each would evict, stored one after
        another, oldest first (none is evicted now)."""
        held, out = self.held_bytes, []
        queue: deque[tuple[CacheEntry | None, int]] = deque(
            (e, e.nbytes) for e in self._entries.values()
        )
        for _ in range(saves if nbytes <= self.budget_bytes else 0):
            while held + nbytes > self.budget_bytes:
                entry, n = queue.popleft()  # None: one of these saves, evicted by the next
                if entry is not None:
                    out.append(entry)
                held -= n
            queue.append((None, nbytes))
            held += nbytes
        return out

    def newest(self) -> CacheEntry | None:
        """The entry used or saved last."""
        return self._entries[next(reversed(self._entries))] if self._entries else None

    def touch(self, ids: tuple[int, ...]) -> None:
        self._entries.move_to_end(ids)

    def get(self, ids: tuple[int, ...]) -> CacheEntry:
        """The entry saved for exactly `ids`, touched."""
        self._entries.move_to_end(ids)
        return self._entries[ids]

    def make_room(self, nbytes: int) -> bool:
        """Evict the oldest snapshots until `nbytes` more fit the budget; False if they never
        can. Called before a snapshot is taken, so the cache never holds more than its budget."""
        if nbytes > self.budget_bytes:
            return False
        while self._entries and self.held_bytes + nbytes > self.budget_bytes:
            self._evict(next(iter(self._entries)))
        return True

    def store(self, ids: list[int] | tuple[int, ...], snapshot: Any, nbytes: int) -> bool:
        """Keep a snapshot, evicting the oldest ones to stay in budget; False if it cannot fit
        (the caller still owns the snapshot then)."""
        key = tuple(ids)
        if not key or not self.make_room(nbytes):
            return False
        if key in self._entries:
            self._evict(key)
        self._entries[key] = CacheEntry(key, snapshot, nbytes)
        return True

    def drop(self, ids: tuple[int, ...]) -> None:
        """Evict one entry without moving it down (it did not check out)."""
        self._evict(ids, move=False)

    def _evict(self, key: tuple[int, ...], move: bool = True) -> None:
        entry = self._entries.pop(key)
        if move and self.move_down is not None:
            self.move_down(entry)
        if self.on_evict is not None:
            self.on_evict(entry.snapshot)

    def clear(self) -> None:
        while self._entries:
            self._evict(next(iter(self._entries)), move=False)


@dataclass(frozen=True)
class RestoreTiming:
    """Where one restore's time went (tools/bench_resume.py prints it)."""

    tier: str
    tokens: int
    read_s: float  # reading and checking the saved file (0 outside the disk tier)
    slot_s: float  # `backend.restore_slot`: the copy into the slot


@dataclass
class CacheStats:
    """What the tiers did (tests and logs read it)."""

    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    whole: int = 0  # of the hits, prompts restored whole with their last logits (no forward)
    misses: int = 0
    refused: int = 0  # matching snapshots that did not check out (prefilled afresh)
    saved: int = 0
    moved_down: int = 0
    last_restore: RestoreTiming | None = None  # the last restore that went through


class TieredPromptCache:
    """The prompt cache of one engine: device, host and disk tiers over one backend.

    Engine thread only (the disk writer's thread sees host arrays, never the backend)."""

    def __init__(
        self,
        backend: Any,
        device_bytes: int,
        host_bytes: int = 0,
        store: SnapshotStore | None = None,
    ) -> None:
        self.backend = backend
        self.device = PromptCache(device_bytes, backend.free_snapshot, self._device_out)
        self.host = PromptCache(host_bytes, move_down=self._host_out)
        self.disk = DiskWriter(store) if store is not None else None
        self.stats = CacheStats()
        # Saved, their disk copy not yet queued: (ids, the host copy where no memory tier
        # keeps the state, else None: the copy is made from the tier at the request's end).
        self._deferred: list[tuple[tuple[int, ...], HostSnapshot | None]] = []
        self._in_reply = False  # a save inside a request: moves down without waiting
        # The last token's logits of the prompts last saved at their end, oldest first.
        self._ends: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self.ready_next()

    @property
    def held_bytes(self) -> int:
        """Bytes held in memory (device and host tiers)."""
        return self.device.held_bytes + self.host.held_bytes

    def __len__(self) -> int:
        return len(self.device) + len(self.host)

    def lookup(self, prompt: list[int]) -> CacheEntry | None:
        """The longest match in memory (device tier first on a tie), touched."""
        best = None
        for tier in (self.device, self.host):
            entry = tier.lookup(prompt, touch=False)
            if entry is not None and (best is None or len(entry.ids) > len(best[1].ids)):
                best = (tier, entry)
        if best is None:
            return None
        best[0].touch(best[1].ids)
        return best[1]

    def where(self, prompt: list[int]) -> tuple[str, tuple[int, ...]] | None:
        """(tier, ids) of the snapshot a restore of `prompt` would take first, or None."""
        found = []
        for name, tier in (("device", self.device), ("host", self.host)):
            entry = tier.lookup(prompt, touch=False)
            if entry is not None:
                found.append((len(entry.ids), -TIERS.index(name), name, entry.ids))
        ids = self.disk.store.lookup(prompt) if self.disk is not None else None
        if ids is not None:
            found.append((len(ids), -TIERS.index("disk"), "disk", ids))
        if not found:
            return None
        _, _, name, ids = max(found)
        return name, ids

    # ----- save --------------------------------------------------------------------------
    def save(
        self,
        slot: int,
        ids: list[int],
        defer_disk: bool = False,
        end_logits: np.ndarray | None = None,
    ) -> None:
        """Keep the slot's state, which holds exactly `ids`: in the device tier where it
        has room, else in the host tier; on disk too (queued to the writer). With
        `defer_disk` (a save inside a request: its prompt's turn start or end) the disk copy,
        which costs a copy to the host, waits for `persist_deferred` at the request's end.
        `end_logits`: the last token's logits, where `ids` is a whole prompt (`restore_end`)."""
        key = tuple(ids)
        if self.disk is not None:
            self.disk.reap()
        if not key:
            return
        if end_logits is not None:
            self._ends[key] = np.array(end_logits, dtype=np.float32)  # a copy: samplers mask
            self._ends.move_to_end(key)
            while len(self._ends) > END_LOGITS:
                self._ends.popitem(last=False)
        for tier in (self.device, self.host):
            if key in tier:  # the same ids hold the same state (resumed = fresh)
                tier.touch(key)
                if self.disk is not None and not self.disk.has(key):
                    # gone from the disk since (`snug cache clear`, another engine's
                    # eviction): written again
                    self._persist(key, tier.get(key).snapshot, defer_disk)
                return
        self._in_reply = defer_disk
        try:
            snapshot = self._take(slot, key)
        finally:
            self._in_reply = False
        if snapshot is None and (self._host_fits(len(key)) or self.disk is not None):
            try:
                snapshot = self.backend.save_slot_to_host(slot, len(key))
            except DeviceOutOfMemory:
                return  # no memory to keep it in: the next turn prefills its history
            if not self.host.store(key, snapshot, snapshot.nbytes):
                # No memory tier keeps it: its disk copy is queued now (the copy to the host
                # is made; `persist_deferred` finds only what a memory tier holds).
                defer_disk = False
        if snapshot is not None:
            self.stats.saved += 1
            self._persist(key, snapshot, defer_disk)

    def _host_fits(self, length: int) -> bool:
        """Whether the host tier could keep a state of `length` tokens (the copy pins host
        memory: not made for a tier it would not fit)."""
        expected = self.backend.snapshot_bytes(length)
        return self.host.budget_bytes >= (expected or 1)

    def _persist(self, key: tuple[int, ...], snapshot: Any, defer_disk: bool) -> None:
        """The disk copy of a saved state: queued now, or held for `persist_deferred`."""
        if defer_disk:
            self._deferred.append((key, None))
        else:
            self._write(key, snapshot)

    def persist_deferred(self) -> None:
        """Queue the disk copies of the saves `save(defer_disk=True)` held back, for those
        still in a memory tier (the end of a request: off its critical path)."""
        held, self._deferred = self._deferred, []
        if held:
            self.backend.settle_host_copies()  # the moves inside the reply are done
        for key, host in held:
            if host is not None:
                self._write(key, host)
                continue
            for tier in (self.device, self.host):
                if key in tier:
                    self._write(key, tier.get(key).snapshot)
                    break

    def ready_next(self) -> None:
        """Have the backend ready (pin) the host buffers that the moves down inside the next
        reply copy into (one for each device snapshot it would move), and the one a restore
        from disk reads into; this reply's may have used them. Only while no reply decodes:
        the driver holds every launch while it pins."""
        moves = self.device.budget_bytes > 0 and self.host.budget_bytes > 0
        if moves or self.disk is not None:
            newest, need = self.device.newest(), 0
            if newest is not None:  # the next turn's states: its ids and a message more
                more = self.backend.snapshot_bytes(len(newest.ids) + NEXT_TURN_TOKENS)
                need = more or newest.nbytes
            victims = self.device.victims(need, MOVES_AHEAD) if need else []
            victims = [e.snapshot for e in victims if self._copied(e)]
            try:
                self.backend.ready_host_copy(restores=self.disk is not None, moves=victims)
            except DeviceOutOfMemory:
                pass  # no memory to pin ahead: a move pins its own, a restore reads pageable

    def _copied(self, entry: CacheEntry) -> bool:
        """Whether a device snapshot leaving the tier is copied to host memory: for the host
        tier where it fits, or for the disk, which does not have it yet."""
        if entry.ids in self.host:
            return False
        return self.host.budget_bytes >= entry.nbytes or not (
            self.disk is None or self.disk.has(entry.ids)
        )

    def _take(self, slot: int, key: tuple[int, ...]) -> Any:
        """A device-tier snapshot of the slot, stored there; None where it has no room."""
        expected = self.backend.snapshot_bytes(len(key))
        if expected is not None and not self.device.make_room(expected):
            return None
        try:
            snapshot = self.backend.save_slot(slot, len(key))
        except DeviceOutOfMemory:
            return None  # no room on the card: the host tier may take it
        if not self.device.store(key, snapshot, self.backend.snapshot_nbytes(snapshot)):
            self.backend.free_snapshot(snapshot)
            return None
        return snapshot

    def _write(self, key: tuple[int, ...], snapshot: Any) -> None:
        """Queue the disk copy of `snapshot` (a device-tier snapshot or a HostSnapshot)."""
        if self.disk is None or self.disk.has(key):
            return
        if not isinstance(snapshot, HostSnapshot):
            try:
                snapshot = self.backend.snapshot_to_host(snapshot)
            except DeviceOutOfMemory:
                return
        self.disk.submit(key, snapshot)

    def _device_out(self, entry: CacheEntry) -> None:
        """A device-tier snapshot leaves: its host copy goes to the host tier if it fits,
        and to disk if it is not there yet. Inside a reply the copy is only queued (no wait
        on the step in flight) and its disk copy waits for `persist_deferred`."""
        key = entry.ids
        if not self._copied(entry):
            return
        written = self.disk is None or self.disk.has(key)
        queued = self._in_reply
        try:
            host = self.backend.snapshot_to_host(entry.snapshot, wait=not queued)
        except DeviceOutOfMemory:
            return
        kept = self.host.store(key, host, host.nbytes)
        if kept:
            self.stats.moved_down += 1
        if not written:
            if queued:  # the host copy itself where no tier keeps it
                self._deferred.append((key, None if kept else host))
            else:
                self.disk.submit(key, host)  # type: ignore[union-attr]

    def _host_out(self, entry: CacheEntry) -> None:
        """A host-tier snapshot leaves: to disk, unless it is there already."""
        if self.disk is not None and not self.disk.has(entry.ids):
            self.backend.settle_host_copies()  # the writer reads its arrays
            self.disk.submit(entry.ids, entry.snapshot)
            self.stats.moved_down += 1

    # ----- restore -----------------------------------------------------------------------
    def restore(self, slot: int, prompt: list[int]) -> tuple[int, ...]:
        """Put the longest snapshot that `prompt` extends into the slot; return its ids
        (empty: nothing restored, the slot is reset and the prompt is prefilled whole)."""
        if self.disk is not None:
            self.disk.reap()
        while True:
            found = self.where(prompt)
            if found is None:
                self.stats.misses += 1
                return ()
            tier, ids = found
            if self._restore_from(tier, slot, ids):
                self.stats.hits[tier] += 1
                log.debug(
                    "prompt cache: restored %d of %d tokens (%s)", len(ids), len(prompt), tier
                )
                return ids
            self.stats.refused += 1
            self.backend.reset_slot(slot)

    def restore_end(self, slot: int, prompt: list[int]) -> np.ndarray | None:
        """Put the state saved at the end of exactly `prompt` into the slot and return its
        last token's logits (a copy), where both are still kept; else None, the slot as it
        was (then `restore` takes the longest prefix)."""
        key = tuple(prompt)
        logits = self._ends.get(key)
        if logits is None:
            return None
        if self.disk is not None:
            self.disk.reap()
        memory = (("device", self.device), ("host", self.host))
        held = [name for name, tier in memory if key in tier]
        if not held and self.disk is not None and self.disk.store.contains(key):
            held = ["disk"]
        if not held:  # its state is gone from every tier
            del self._ends[key]
            return None
        if not self._restore_from(held[0], slot, key):
            self.stats.refused += 1
            self.backend.reset_slot(slot)
            del self._ends[key]
            return None
        self.stats.hits[held[0]] += 1
        self.stats.whole += 1
        self._ends.move_to_end(key)
        log.debug("prompt cache: restored a whole prompt of %d tokens (%s)", len(key), held[0])
        return logits.copy()

    def _restore_from(self, tier: str, slot: int, ids: tuple[int, ...]) -> bool:
        lent: list[np.ndarray] = []  # the backend's host buffer a disk read went into
        try:
            return self._restore(tier, slot, ids, lent)
        finally:
            for buffer in lent:  # the slot holds the state now, or it was refused
                self.backend.return_host_buffer(buffer)

    def _restore(self, tier: str, slot: int, ids: tuple[int, ...], lent: list) -> bool:
        start = time.perf_counter()
        if tier == "disk":
            snapshot = self._load(ids, lent)
            if snapshot is None:  # refused and logged by the store
                return False
        else:
            snapshot = (self.device if tier == "device" else self.host).get(ids).snapshot
        read = time.perf_counter()
        if isinstance(snapshot, HostSnapshot) and snapshot.length != len(ids):
            why = f"it holds {snapshot.length} tokens, its ids {len(ids)}"
            return self._refuse(tier, ids, why)
        try:
            self.backend.restore_slot(slot, snapshot)
        except SnapshotMismatch as exc:
            return self._refuse(tier, ids, str(exc))
        done = time.perf_counter()
        read_s = read - start if tier == "disk" else 0.0
        self.stats.last_restore = RestoreTiming(tier, len(ids), read_s, done - read)
        if tier == "disk" and not lent:  # in host memory now: keep it there while it has room
            self.host.store(ids, snapshot, snapshot.nbytes)
        return True

    def _load(self, ids: tuple[int, ...], lent: list) -> HostSnapshot | None:
        """The disk entry for `ids`, read into the backend's host buffer where it lends one
        (appended to `lent`: it goes back once the slot holds the state, so the host tier
        does not keep that snapshot; it stays on disk), else into a buffer of its own."""
        assert self.disk is not None

        def buffer(nbytes: int) -> np.ndarray | None:
            out = self.backend.host_buffer(nbytes)
            if out is not None:
                lent.append(out)
            return out

        return self.disk.store.load(ids, buffer)

    def _refuse(self, tier: str, ids: tuple[int, ...], why: str) -> bool:
        log.warning(
            "prompt cache: refusing a saved state of %d tokens from the %s tier: %s; the "
            "prompt is prefilled afresh",
            len(ids),
            tier,
            why,
        )
        if tier == "disk":
            assert self.disk is not None
            store = self.disk.store
            store.remove(entry_name(store.key, ids))
        else:
            (self.device if tier == "device" else self.host).drop(ids)
        return False

    # ----- lifetime ----------------------------------------------------------------------
    def flush(self) -> None:
        """Wait for the queued disk writes (tests, and before a restart)."""
        if self.disk is not None:
            self.disk.flush()

    def clear(self) -> None:
        """Drop every saved state in memory, and this model's on disk."""
        self._ends.clear()
        self.device.clear()
        self.host.clear()
        if self.disk is not None:
            self.disk.flush()
            self.disk.store.clear()

    def close(self) -> None:
        """At unload: finish the disk writes (a restart finds them), free the memory tiers."""
        if self.disk is not None:
            self.disk.close()
        self.device.clear()
        self.host.clear()


def open_prompt_cache(
    backend: Any, model_dir: str | os.PathLike[str], tensors: dict[str, Any], device_bytes: int
) -> TieredPromptCache:
    """The prompt cache of an engine: budgets and folder from the backend's settings
    (`prompt_cache_host_bytes`, `prompt_cache_dir`, `prompt_cache_disk_bytes`); the disk
    tier's entries are keyed by the model's fingerprint, the engine's version and the
    backend's precision."""
    import engine

    settings = backend.settings
    store = None
    if settings.prompt_cache_dir and settings.prompt_cache_disk_bytes > 0:
        folder = Path(settings.prompt_cache_dir).expanduser()
        try:
            fingerprint = model_fingerprint(model_dir, tensors)
            key = StoreKey(fingerprint, engine.__version__, backend.precision)
            store = SnapshotStore(folder, key, settings.prompt_cache_disk_bytes)
        except OSError as exc:  # a read-only or missing parent folder: memory tiers only
            log.warning("prompt cache: no disk tier, %s cannot be used (%s)", folder, exc)
    return TieredPromptCache(backend, device_bytes, settings.prompt_cache_host_bytes, store)
