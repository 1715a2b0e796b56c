"""Saved stream states on disk: the prompt cache's last tier, so a chat resumes after a restart.

A snapshot is a stream's state at an exact position (KV up to its length, DeltaNet conv and
recurrent state) plus the token ids it holds. On disk each one is two files in the store's
folder, named by a hash of what it is (model, engine, precision) and of the ids:

    <hash>.safetensors   the state's arrays (bf16 as uint16 bits), written with safetensors
    <hash>.json          what it is: the ids, the model's fingerprint (config.json, the
                         tensor headers and a sample of the weights), the engine version,
                         the precision, the arrays' names, dtypes and shapes, and the
                         safetensors file's XXH3-128 checksums (the `xxhash` library: a
                         16K-token state of the 4B is 0.55 GB, which sha256 takes most of
                         a second to check), one per block of `block_bytes` bytes
                         (`xxh3_128`, a list; the last block may be shorter)

Both are written to temporary names and renamed into place, the JSON last, so a crash or a
full disk mid-write leaves the old cache valid (an entry without its JSON is not an entry).
A restore reads the file once into one buffer (a new one, or the caller's: the CUDA
backend's pinned memory), on up to READ_THREADS threads that each check the blocks they
read as they read them, so the checksums cost little past the read; then it checks the
header (the safetensors rules of engine/checkpoint/header.py) and hands out views of the
buffer (engine.snapshot_file). A file that does not check out (truncated, corrupt, another
model, engine version, precision or format) is refused with a logged reason; the caller
prefills afresh, never restores a wrong state. Several models and engine versions may
share the folder: the byte budget counts every entry in it, and the least recently used go
first, whoever wrote them.

Several engines may use the folder at once (two app windows, the app and `snug serve`, and
`snug cache clear` beside them). A save, the removal of what an interrupted save left and a
clear hold the folder's lock file (LOCK_NAME, with the `filelock` library), so none of them
deletes another's temporary files or data whose JSON is still to come; a restore takes no
lock (it reads whole files, checked). engine.snapshot_folder owns the lock, which files are
saved states, and the clear of `snug cache clear`. Before a save evicts for room, and at
each lookup, the store brings its index up to the folder (`_refresh`): entries that others
saved count against the budget, and those others evicted or cleared are neither restored
nor taken for saved. `engine.snapshot_writer.DiskWriter` saves on a thread of its own, so
that a reply never waits for the disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.snapshot_file import block_checksums, read_checked
from engine.snapshot_folder import LOCK_NAME as LOCK_NAME  # where callers have named it
from engine.snapshot_folder import (
    files_size,
    folder_lock,
    state_files,
    unlink,
)

log = logging.getLogger(__name__)

FORMAT = 3  # bump when the layout of a snapshot changes (3: XXH3-128 checksums per block)
BLOCK_BYTES = 8 << 20  # a checksum's block: 69 of them in a 16K-token state of the 4B


class SnapshotMismatch(ValueError):
    """A host snapshot whose arrays are not the ones this backend's state holds."""


@dataclass
class HostSnapshot:
    """A stream's state in host memory: flat names ("kv_k.0", "recurrent.3") -> arrays."""

    length: int
    arrays: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    def check(self, expected: dict[str, tuple[tuple[int, ...], Any]]) -> None:
        """Raise SnapshotMismatch unless the arrays are exactly `expected` (name -> shape,
        dtype): a restore never broadcasts or casts a state into a slot."""
        if set(self.arrays) != set(expected):
            extra, missing = set(self.arrays) - set(expected), set(expected) - set(self.arrays)
            raise SnapshotMismatch(
                f"snapshot arrays differ from the state's: missing {sorted(missing)[:4]}, "
                f"unexpected {sorted(extra)[:4]}"
            )
        for name, (shape, dtype) in expected.items():
            a = self.arrays[name]
            if tuple(a.shape) != tuple(shape) or a.dtype != np.dtype(dtype):
                raise SnapshotMismatch(
                    f"snapshot array {name} is {a.dtype}{list(a.shape)}, the state holds "
                    f"{np.dtype(dtype)}{list(shape)}"
                )


@dataclass(frozen=True)
class StoreKey:
    """What a snapshot must match to be restored: the model, the engine and the precision."""

    model: str  # fingerprint: config.json, the tensor headers, a sample of the weights
    engine: str  # the engine's version
    precision: str  # backend and activation type, e.g. "cuda:bfloat16", "numpy:float32"


@dataclass
class _Entry:
    ids: tuple[int, ...] | None  # None: another writer's entry whose ids could not be read
    nbytes: int
    used: float = field(default_factory=time.time)
    foreign: str = ""  # why it is not this store's to restore ("" when it is)


def ids_hash(ids: tuple[int, ...] | list[int]) -> str:
    return hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()[:32]


def entry_name(key: StoreKey, ids: tuple[int, ...] | list[int]) -> str:
    """The files' stem: the same ids under another model or engine get other files."""
    h = hashlib.sha256(f"{key.model}|{key.engine}|{key.precision}|".encode())
    h.update(np.asarray(ids, np.int64).tobytes())
    return h.hexdigest()[:32]


def model_fingerprint(model_dir: str | os.PathLike[str], tensors: dict[str, Any]) -> str:
    """sha256 of config.json's bytes, every tensor's name, shape and dtype, and a sample of
    every stored tensor's values (`_weights_sample`): a fine-tune of the same architecture
    often keeps config.json and every shape, and its states are not the base model's. The
    folder's name and place are not in it (a renamed or moved model keeps its cache)."""
    h = hashlib.sha256(Path(model_dir, "config.json").read_bytes())
    for name in sorted(tensors):
        info = tensors[name]
        h.update(f"{name}:{tuple(info.shape)}:{info.dtype};".encode())
    for file in sorted({f for f in (getattr(i, "file", None) for i in tensors.values()) if f}):
        h.update(_weights_sample(Path(model_dir, file)))
    return h.hexdigest()


def _weights_sample(path: Path, span: int = 64) -> bytes:
    """`span` bytes from the middle of each tensor stored in a safetensors file (one short
    read each, of pages the weights' load has just read)."""
    from engine.checkpoint.header import parse_header
    from engine.errors import CheckpointError

    out = bytearray()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = int.from_bytes(f.read(8), "little")
        try:
            entries, _ = parse_header(f.read(min(n, size)), path, size)
        except CheckpointError as exc:  # the checkpoint loaded: not expected
            raise OSError(f"{path}: {exc}") from None
        for name in sorted(entries):
            e = entries[name]
            f.seek(max(e.start, (e.start + e.end - span) // 2))
            out += f.read(min(span, e.end - e.start))
    return bytes(out)


class SnapshotStore:
    """A folder of snapshots, restored for one (model, engine, precision), bounded by
    `budget_bytes` over everything in the folder. Safe to use from two threads (the engine
    thread reads, the writer thread saves): the index is guarded by a lock, and a file is
    only ever replaced whole; and beside other stores on the same folder (`folder_lock`)."""

    def __init__(self, folder: str | os.PathLike[str], key: StoreKey, budget_bytes: int):
        self.folder = Path(folder)
        self.key = key
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: dict[str, _Entry] = {}
        self._told: set[str] = set()  # foreign entries whose refusal was logged
        self._stuck: set[str] = set()  # removed from the index, its files not from the disk
        self._said_too_large = False
        self._lock_level = logging.WARNING  # of the next "could not lock"
        self._lock = threading.RLock()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._scan()

    # ----- index -----------------------------------------------------------------------------
    def _scan(self) -> None:
        """Remove what an interrupted save left (temporary files, data without its index),
        under the folder's lock: another engine's save in flight holds it, and its files
        are not leftovers. Then index every entry (this key's, and others' for the budget)."""
        with folder_lock(self.folder) as held:
            if held:
                for leftover in state_files(self.folder, "*.tmp"):
                    unlink(leftover)
                for data in state_files(self.folder, "*.safetensors"):
                    if not data.with_suffix(".json").exists():
                        unlink(data)
            self._refresh()

    def _refresh(self, times: bool = False) -> None:
        """Bring the index up to the folder's entries: others (another engine on the folder,
        `snug cache clear`) may have saved or removed some since it was read. With `times`
        (before an eviction, the only reader of `used`), each entry's last use too: a
        restore by another engine touches its JSON (a stat an entry: not on a lookup)."""
        try:
            on_disk = {p.stem: p for p in state_files(self.folder, "*.json")}
        except OSError:
            return
        for name in list(self._stuck):  # retried: the budget counts what is on the disk
            if name not in on_disk or self._unlink_entry(name, quiet=True):
                self._stuck.discard(name)
        with self._lock:
            for name in [n for n in self._entries if n not in on_disk]:
                del self._entries[name]
            known = set(self._entries)
        for name, meta_path in on_disk.items():
            if name in self._stuck:
                continue
            if name not in known:
                self._index(meta_path)
                continue
            if not times:
                continue
            try:
                used = meta_path.stat().st_mtime  # a restore by another engine touches it
            except OSError:
                continue
            with self._lock:
                entry = self._entries.get(name)
                if entry is not None:
                    entry.used = max(entry.used, used)

    def _index(self, meta_path: Path) -> None:
        name = meta_path.stem
        try:
            meta = json.loads(meta_path.read_text())
            if not isinstance(meta, dict):
                raise TypeError("the index is not an object")
            used = meta_path.stat().st_mtime
            why = self._mismatch(meta)
            if why:
                entry = _Entry(_ids_or_none(meta), files_size(self.folder, name), used, why)
            else:
                ids = tuple(int(i) for i in meta["ids"])
                if entry_name(self.key, ids) != name:
                    raise ValueError("the ids do not hash to the file's name")
                entry = _Entry(ids, files_size(self.folder, name), used)  # all it takes
        except FileNotFoundError:
            return  # removed since the folder was listed
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self._refuse(name, f"unreadable index ({type(exc).__name__}: {exc})")
            return
        with self._lock:
            self._entries[name] = entry

    def _mismatch(self, meta: dict) -> str:
        """Why an index is not this store's to restore ("" when it is)."""
        for label, want in (
            ("format", FORMAT),
            ("model", self.key.model),
            ("engine", self.key.engine),
            ("precision", self.key.precision),
        ):
            got = meta.get(label)
            if got != want:
                if label == "model":
                    return "another model"
                return f"{label} {str(got)[:40]!r} (this is {want!r})"
        return ""

    @property
    def held_bytes(self) -> int:
        """Bytes of every entry in the folder (this key's and others')."""
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        """Entries this store can restore."""
        with self._lock:
            return sum(1 for e in self._entries.values() if not e.foreign)

    def contains(self, ids: tuple[int, ...] | list[int]) -> bool:
        """Whether a state this store can restore is saved for exactly `ids` (its index is
        still on the disk: `snug cache clear` or another engine may have removed it)."""
        name = entry_name(self.key, ids)
        with self._lock:
            entry = self._entries.get(name)
            if entry is None or entry.foreign:
                return False
        if (self.folder / f"{name}.json").exists():
            return True
        with self._lock:
            self._entries.pop(name, None)
        return False

    def lookup(self, prompt: list[int]) -> tuple[int, ...] | None:
        """The ids of the longest entry that is a proper prefix of `prompt`, or None. A
        longer one saved by another model, engine or precision is refused, and logged."""
        self._refresh()
        best: tuple[int, ...] | None = None
        foreign: list[tuple[str, _Entry]] = []
        with self._lock:
            for name, entry in self._entries.items():
                ids = entry.ids
                if ids is None or len(ids) >= len(prompt) or tuple(prompt[: len(ids)]) != ids:
                    continue
                if entry.foreign:
                    foreign.append((name, entry))
                elif best is None or len(ids) > len(best):
                    best = ids
        for name, entry in foreign:
            if name not in self._told and len(entry.ids or ()) > len(best or ()):
                self._told.add(name)
                log.info(
                    "prompt cache: not restoring a saved state of %d tokens in %s: it was "
                    "saved for %s; the prompt is prefilled afresh",
                    len(entry.ids or ()),
                    self.folder,
                    entry.foreign,
                )
        return best

    # ----- write -----------------------------------------------------------------------------
    def save(self, ids: list[int] | tuple[int, ...], snapshot: HostSnapshot) -> bool:
        """Write one snapshot atomically; False (logged) when it cannot be kept. An entry
        already saved for the same ids is the same state (resumed = fresh): kept as it is."""
        key = tuple(int(i) for i in ids)
        nbytes = snapshot.nbytes
        if not key or nbytes > self.budget_bytes:
            if key and not self._said_too_large:
                self._said_too_large = True
                log.info(
                    "prompt cache: a saved state of %d bytes is larger than the disk budget "
                    "of %d bytes (%s): such states are not written",
                    nbytes,
                    self.budget_bytes,
                    self.folder,
                )
            return False
        name = entry_name(self.key, key)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)  # removed by hand: made again
        except OSError as exc:
            log.warning("prompt cache: could not save a snapshot to %s (%s)", self.folder, exc)
            return False
        # The whole write holds the folder's lock: another engine's start or `snug cache
        # clear` would take its temporary files, or its data before the JSON, for leftovers.
        with folder_lock(self.folder, level=self._lock_level) as held:
            if not held:
                self._lock_level = logging.DEBUG  # said once (a read-only folder)
                return False
            self._refresh(times=True)  # what others saved and used counts too
            with self._lock:
                entry = self._entries.get(name)
                if entry is not None and not entry.foreign:
                    entry.used = time.time()
                    with contextlib.suppress(OSError):
                        os.utime(self.folder / f"{name}.json")  # for the other engines
                    return True
                self._entries.pop(name, None)  # another format's entry: replaced
                self._make_room(nbytes, keep=name)
            if not self._write(name, key, snapshot):
                return False
            self._stuck.discard(name)
            with self._lock:  # the budget counts the files: the index and header too
                self._entries[name] = _Entry(key, files_size(self.folder, name))
                self._make_room(0, keep=name)
                if self.held_bytes > self.budget_bytes:  # alone, over the budget
                    self.remove(name)
                    return False
        return True

    def _write(self, name: str, key: tuple[int, ...], snapshot: HostSnapshot) -> bool:
        from safetensors import SafetensorError
        from safetensors.numpy import save_file

        data, meta = self.folder / f"{name}.safetensors", self.folder / f"{name}.json"
        tmp_data = tmp_meta = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".safetensors.tmp")
            os.close(fd)
            tmp_data = Path(tmp)
            arrays = {k: np.ascontiguousarray(v) for k, v in snapshot.arrays.items()}
            save_file(arrays, str(tmp_data))
            info = {
                "format": FORMAT,
                "model": self.key.model,
                "engine": self.key.engine,
                "precision": self.key.precision,
                "ids": list(key),
                "length": snapshot.length,
                "nbytes": snapshot.nbytes,
                "arrays": {k: [str(v.dtype), list(v.shape)] for k, v in arrays.items()},
                "block_bytes": BLOCK_BYTES,
                "xxh3_128": block_checksums(tmp_data, BLOCK_BYTES),
            }
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".json.tmp")
            tmp_meta = Path(tmp)  # before the write: a full disk fails it, and it goes
            with os.fdopen(fd, "w") as f:
                json.dump(info, f)
            os.replace(tmp_data, data)
            tmp_data = None
            os.replace(tmp_meta, meta)  # the entry exists from here on
            tmp_meta = None
        except (OSError, SafetensorError) as exc:  # a full disk, a read-only folder
            log.warning("prompt cache: could not save a snapshot to %s (%s)", self.folder, exc)
            return False
        finally:
            for leftover in (tmp_data, tmp_meta):
                if leftover is not None:
                    unlink(leftover)
        return True

    def _make_room(self, nbytes: int, keep: str) -> None:
        while self._entries and self.held_bytes + nbytes > self.budget_bytes:
            oldest = min(
                (n for n in self._entries if n != keep),
                key=lambda n: self._entries[n].used,
                default=None,
            )
            if oldest is None:
                return
            self.remove(oldest)

    def remove(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
        if not self._unlink_entry(name):
            self._stuck.add(name)  # not indexed again; retried at each `_refresh`

    def _unlink_entry(self, name: str, quiet: bool = False) -> bool:
        for suffix in (".json", ".safetensors"):  # the JSON first: no half entry is indexed
            path = self.folder / f"{name}{suffix}"
            if quiet:
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    return False
            elif not unlink(path):
                return False
        return True

    def _refuse(self, name: str, why: str) -> None:
        path = self.folder / name  # the folder named: several may be in use
        log.warning("prompt cache: refusing saved state %s: %s; it is removed", path, why)
        self.remove(name)

    # ----- read ------------------------------------------------------------------------------
    def load(
        self, ids: tuple[int, ...], buffer: Callable[[int], np.ndarray | None] | None = None
    ) -> HostSnapshot | None:
        """The snapshot saved for exactly `ids`, or None (logged) when it does not check
        out: the caller then prefills afresh. `buffer`: where to read the file, as for
        `read_checked` (the snapshot's arrays are views of it)."""
        name = entry_name(self.key, ids)
        data, meta_path = self.folder / f"{name}.safetensors", self.folder / f"{name}.json"
        try:
            meta = json.loads(meta_path.read_text())
            if not isinstance(meta, dict):
                raise TypeError("the index is not an object")
            if self._mismatch(meta) or tuple(meta["ids"]) != tuple(ids):
                self._refuse(name, "it was saved for another model, engine or precision")
                return None
            try:
                arrays = read_checked(data, meta["xxh3_128"], meta["block_bytes"], buffer)
            except ValueError as exc:
                self._refuse(name, str(exc))
                return None
            want = {k: (dt, tuple(shape)) for k, (dt, shape) in meta["arrays"].items()}
            got = {k: (str(v.dtype), tuple(v.shape)) for k, v in arrays.items()}
            if got != want:
                self._refuse(name, "its arrays are not the ones its index lists")
                return None
            length = int(meta["length"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            self._refuse(name, f"it cannot be read ({type(exc).__name__}: {exc})")
            return None
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None:
                entry.used = time.time()
        try:
            os.utime(meta_path)
        except OSError:
            pass  # a read-only folder still restores; only the recency is lost
        return HostSnapshot(length, arrays)

    def clear(self) -> None:
        """Remove this key's entries (others' stay)."""
        with self._lock:
            names = [n for n, e in self._entries.items() if not e.foreign]
        for name in names:
            self.remove(name)


def _ids_or_none(meta: dict) -> tuple[int, ...] | None:
    try:
        return tuple(int(i) for i in meta["ids"])
    except (KeyError, TypeError, ValueError):
        return None
