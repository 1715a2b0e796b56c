"""Saved stream states on disk: the prompt cache's last tier, so a chat resumes after a restart.

A snapshot is a stream's state at an exact position (KV up to its length, DeltaNet conv and
recurrent state) plus the token ids it holds. On disk each one is two files in the store's
folder, named by a hash of what it is (model, engine, precision) and of the ids:

    <hash>.safetensors   the state's arrays (bf16 as uint16 bits), written with safetensors
    <hash>.json          what it is: the ids, the model's fingerprint (config.json and the
                         tensor headers), the engine version, the precision, the arrays'
                         names, dtypes and shapes, and the safetensors file's XXH3-128
                         checksums (the `xxhash` library: a 16K-token state of the 4B is
                         0.55 GB, which sha256 takes most of a second to check), one per
                         block of `block_bytes` bytes (`xxh3_128`, a list; the last block
                         may be shorter)

Both are written to temporary names and renamed into place, the JSON last, so a crash or a
full disk mid-write leaves the old cache valid (an entry without its JSON is not an entry).
A restore reads the file once into one buffer (a new one, or the caller's: the CUDA
backend's pinned memory), on up to READ_THREADS threads that each check the blocks they
read as they read them, so the checksums cost little past the read; then it checks the
header (the safetensors rules of engine/checkpoint/header.py) and hands out views of the
buffer. A file that does not check out (truncated, corrupt, another model, engine version,
precision or format) is refused with a logged reason; the caller prefills afresh, never
restores a wrong state. Several models and engine versions may share the folder: the byte
budget counts every entry in it, and the least recently used go first, whoever wrote them.

`DiskWriter` saves on a thread of its own, so that a reply never waits for the disk.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import queue
import re
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

FORMAT = 3  # bump when the layout of a snapshot changes (3: XXH3-128 checksums per block)
WRITE_QUEUE_DEPTH = 4  # snapshots waiting for the writer; past it a write is skipped
BLOCK_BYTES = 8 << 20  # a checksum's block: 69 of them in a 16K-token state of the 4B
READ_THREADS = min(8, os.cpu_count() or 1)  # threads reading (and checking) a saved file
READ_CHUNK = 1 << 20  # each read is hashed while it is still in the reading core's cache


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

    model: str  # fingerprint: sha256 of config.json and the tensor headers
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


# The only files a store reads, evicts or removes: a state's <32 hex digits>.json and
# .safetensors, and what an interrupted save leaves (mkstemp's tmp*.json.tmp and
# tmp*.safetensors.tmp). Nothing else in the folder is touched (a model's folder given as
# the cache folder by mistake keeps its config.json and weights).
_STATE_FILE = re.compile(r"[0-9a-f]{32}\.(json|safetensors)|tmp\w*\.(json|safetensors)\.tmp")


def is_state_file(name: str) -> bool:
    return _STATE_FILE.fullmatch(name) is not None


def state_files(folder: Path, pattern: str) -> list[Path]:
    """The files in `folder` matching `pattern` that a store owns (`is_state_file`)."""
    return [p for p in folder.glob(pattern) if is_state_file(p.name)]


def entry_name(key: StoreKey, ids: tuple[int, ...] | list[int]) -> str:
    """The files' stem: the same ids under another model or engine get other files."""
    h = hashlib.sha256(f"{key.model}|{key.engine}|{key.precision}|".encode())
    h.update(np.asarray(ids, np.int64).tobytes())
    return h.hexdigest()[:32]


def model_fingerprint(model_dir: str | os.PathLike[str], tensors: dict[str, Any]) -> str:
    """sha256 of config.json's bytes and every tensor's name, shape and dtype."""
    h = hashlib.sha256(Path(model_dir, "config.json").read_bytes())
    for name in sorted(tensors):
        info = tensors[name]
        h.update(f"{name}:{tuple(info.shape)}:{info.dtype};".encode())
    return h.hexdigest()


def _block_checksums(path: Path, block_bytes: int = BLOCK_BYTES) -> list[str]:
    """XXH3-128 of each `block_bytes` block of a file, the last one shorter (read back on
    the writer's thread)."""
    import xxhash

    with open(path, "rb") as f:
        return [xxhash.xxh3_128_hexdigest(b) for b in iter(lambda: f.read(block_bytes), b"")]


# numpy's type for each safetensors dtype a saved state uses (bf16 is stored as U16 bits).
_NUMPY_DTYPES = {
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "F16": np.float16,
    "I32": np.int32,
    "U32": np.uint32,
    "F32": np.float32,
    "I64": np.int64,
    "F64": np.float64,
}


def read_checked(
    path: Path,
    checksums: list[str],
    block_bytes: int,
    buffer: Callable[[int], np.ndarray | None] | None = None,
) -> dict[str, np.ndarray]:
    """The arrays of a saved state's safetensors file, as views of one buffer the file is
    read into once; ValueError (with the reason) when its length, a block's checksum or its
    header does not check out. `buffer(nbytes)`: where to read it (a writable contiguous
    uint8 array of at least `nbytes`, whose first `nbytes` it fills), or None to read it
    into a new array. Writing the parser here, not calling safetensors' loader, saves a
    copy of every array and a second read of the file for the checksums."""
    from engine.checkpoint.header import parse_header
    from engine.errors import CheckpointError

    size = path.stat().st_size
    blocks = -(-size // block_bytes) if block_bytes > 0 else -1
    if size < 8 or blocks != len(checksums):
        raise ValueError(
            f"its {size} bytes are not the {len(checksums)} blocks of {block_bytes} bytes its "
            "checksums cover (truncated or rewritten)"
        )
    out = buffer(size) if buffer is not None else None
    if out is None:
        buf = np.empty(size, np.uint8)
    else:
        assert out.dtype == np.uint8 and out.ndim == 1 and out.nbytes >= size, out.shape
        assert out.flags.c_contiguous and out.flags.writeable
        buf = out[:size]
    _read_blocks(path, buf, checksums, block_bytes)
    n = int.from_bytes(buf[:8].tobytes(), "little")
    if n > min(size - 8, 100_000_000):
        raise ValueError(f"its header length {n} does not fit the file")
    try:
        entries, _ = parse_header(buf[8 : 8 + n].tobytes(), path, size)
    except CheckpointError as exc:
        raise ValueError(str(exc)[:300]) from None
    arrays = {}
    for name, e in entries.items():
        if e.dtype not in _NUMPY_DTYPES:
            raise ValueError(f"array {name[:80]!r} has dtype {e.dtype[:16]!r}")
        arrays[name] = buf[e.start : e.end].view(_NUMPY_DTYPES[e.dtype]).reshape(e.shape)
    return arrays


def _read_blocks(path: Path, buf: np.ndarray, checksums: list[str], block_bytes: int) -> None:
    """Fill `buf` with the file's bytes, block by block on up to READ_THREADS threads (the
    reads and the hashing release the GIL), each block checked against its checksum as it
    is read; ValueError naming the first block that does not check out. Every thread is
    done with `buf` when this returns (the caller holds the last reference: a pinned
    buffer is freed on the engine thread)."""
    import xxhash

    size = buf.nbytes

    def check(block: int) -> bool:
        start, end = block * block_bytes, min(size, (block + 1) * block_bytes)
        h = xxhash.xxh3_128()
        with open(path, "rb", buffering=0) as f:  # a handle each: no shared file offset
            f.seek(start)
            while start < end:
                view = memoryview(buf[start : min(end, start + READ_CHUNK)])
                got = f.readinto(view)
                if not got:
                    return False  # the file got shorter since its size was read
                h.update(view[:got])
                start += got
        return h.hexdigest() == checksums[block]

    threads = max(1, min(READ_THREADS, len(checksums)))
    with ThreadPoolExecutor(threads, thread_name_prefix="snug-cache-read") as pool:
        good = list(pool.map(check, range(len(checksums))))
    if not all(good):
        bad = good.index(False)
        raise ValueError(
            f"its block {bad} of {len(good)} does not match its checksum (corrupt or truncated)"
        )


def _files_size(folder: Path, name: str) -> int:
    total = 0
    for suffix in (".json", ".safetensors"):
        try:
            total += (folder / f"{name}{suffix}").stat().st_size
        except OSError:
            pass
    return total


class SnapshotStore:
    """A folder of snapshots, restored for one (model, engine, precision), bounded by
    `budget_bytes` over everything in the folder. Safe to use from two threads (the engine
    thread reads, the writer thread saves): the index is guarded by a lock, and a file is
    only ever replaced whole."""

    def __init__(self, folder: str | os.PathLike[str], key: StoreKey, budget_bytes: int):
        self.folder = Path(folder)
        self.key = key
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: dict[str, _Entry] = {}
        self._told: set[str] = set()  # foreign entries whose refusal was logged
        self._lock = threading.RLock()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._scan()

    # ----- index -----------------------------------------------------------------------------
    def _scan(self) -> None:
        """Index every entry (this key's, and others' for the budget); remove what an
        interrupted save left (temporary files, data without its index)."""
        for leftover in state_files(self.folder, "*.tmp"):
            leftover.unlink(missing_ok=True)
        for data in state_files(self.folder, "*.safetensors"):
            if not data.with_suffix(".json").exists():
                data.unlink(missing_ok=True)
        for meta_path in state_files(self.folder, "*.json"):
            name = meta_path.stem
            try:
                meta = json.loads(meta_path.read_text())
                if not isinstance(meta, dict):
                    raise TypeError("the index is not an object")
                used = meta_path.stat().st_mtime
                why = self._mismatch(meta)
                if why:
                    self._entries[name] = _Entry(
                        _ids_or_none(meta), _files_size(self.folder, name), used, why
                    )
                    continue
                ids = tuple(int(i) for i in meta["ids"])
                if entry_name(self.key, ids) != name:
                    raise ValueError("the ids do not hash to the file's name")
                self._entries[name] = _Entry(ids, int(meta["nbytes"]), used)
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                self._refuse(name, f"unreadable index ({type(exc).__name__}: {exc})")

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
        with self._lock:
            return entry_name(self.key, ids) in self._entries

    def lookup(self, prompt: list[int]) -> tuple[int, ...] | None:
        """The ids of the longest entry that is a proper prefix of `prompt`, or None. A
        longer one saved by another model, engine or precision is refused, and logged."""
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
        from safetensors.numpy import save_file

        key = tuple(int(i) for i in ids)
        nbytes = snapshot.nbytes
        if not key or nbytes > self.budget_bytes:
            return False
        name = entry_name(self.key, key)
        with self._lock:
            if name in self._entries:
                self._entries[name].used = time.time()
                return True
            self._make_room(nbytes, keep=name)
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
                "nbytes": nbytes,
                "arrays": {k: [str(v.dtype), list(v.shape)] for k, v in arrays.items()},
                "block_bytes": BLOCK_BYTES,
                "xxh3_128": _block_checksums(tmp_data, BLOCK_BYTES),
            }
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".json.tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(info, f)
            tmp_meta = Path(tmp)
            os.replace(tmp_data, data)
            tmp_data = None
            os.replace(tmp_meta, meta)  # the entry exists from here on
            tmp_meta = None
        except OSError as exc:  # a full disk, a read-only folder: keep what was there
            log.warning("prompt cache: could not save a snapshot to %s (%s)", self.folder, exc)
            return False
        finally:
            for leftover in (tmp_data, tmp_meta):
                if leftover is not None:
                    leftover.unlink(missing_ok=True)
        with self._lock:
            self._entries[name] = _Entry(key, nbytes)
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
        for suffix in (".json", ".safetensors"):  # the JSON first: no half entry is indexed
            (self.folder / f"{name}{suffix}").unlink(missing_ok=True)

    def _refuse(self, name: str, why: str) -> None:
        log.warning("prompt cache: refusing saved state %s: %s; it is removed", name, why)
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
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
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


def clear_folder(folder: str | os.PathLike[str], model: str | None = None) -> tuple[int, int]:
    """Remove the saved states in `folder` (only those of the model with fingerprint `model`
    when given), and what interrupted saves left; returns (entries, bytes) removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0, 0
    count = removed = 0
    for meta_path in state_files(folder, "*.json"):
        if model is not None:
            try:
                if json.loads(meta_path.read_text()).get("model") != model:
                    continue
            except (OSError, ValueError, AttributeError, RecursionError):
                continue  # not readable: not known to be this model's
        removed += _files_size(folder, meta_path.stem)
        count += 1
        for suffix in (".json", ".safetensors"):
            (folder / f"{meta_path.stem}{suffix}").unlink(missing_ok=True)
    if model is None:
        for leftover in (*state_files(folder, "*.tmp"), *state_files(folder, "*.safetensors")):
            removed += leftover.stat().st_size
            leftover.unlink(missing_ok=True)
    return count, removed


class DiskWriter:
    """Saves snapshots to a store on a thread of its own (bounded queue: a snapshot that
    finds it full is not written now; `submit` returns False).

    The thread touches numpy arrays only. The engine thread hands it host copies and keeps
    a reference to each until its write is done (`reap`), so that the last reference to a
    pinned buffer is never dropped here: freeing it is CuPy's business, on the engine thread.
    """

    def __init__(self, store: SnapshotStore, depth: int = WRITE_QUEUE_DEPTH) -> None:
        self.store = store
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._held: dict[int, tuple[tuple[int, ...], HostSnapshot]] = {}  # engine thread
        self._done: deque[int] = deque()  # tickets written (or failed), from the writer
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None

    def has(self, ids: tuple[int, ...]) -> bool:
        """Saved, or queued to be."""
        self.reap()
        return any(held[0] == ids for held in self._held.values()) or self.store.contains(ids)

    def submit(self, ids: tuple[int, ...], snapshot: HostSnapshot) -> bool:
        """Queue one snapshot; False when the queue is full (the write is skipped)."""
        if self.has(ids):
            return True
        ticket = next(self._tickets)
        try:
            self._queue.put_nowait((ticket, ids, snapshot))
        except queue.Full:
            log.info("prompt cache: the disk writer is busy; a saved state is not written now")
            return False
        self._held[ticket] = (ids, snapshot)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="snug-cache-writer")
            self._thread.daemon = True  # an interrupted write leaves the old cache valid
            self._thread.start()
        return True

    def reap(self) -> None:
        """Drop the snapshots whose writes are done (engine thread)."""
        while self._done:
            self._held.pop(self._done.popleft(), None)

    def flush(self) -> None:
        """Wait until every queued snapshot is written."""
        if self._thread is not None:
            self._queue.join()
        self.reap()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self.reap()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            ticket = item[0]
            self._write(item)
            del item  # this thread's last reference goes before the engine thread may reap
            self._done.append(ticket)
            self._queue.task_done()

    def _write(self, item: tuple[int, tuple[int, ...], HostSnapshot]) -> None:
        _, ids, snapshot = item
        try:
            self.store.save(ids, snapshot)
        except Exception:  # a bug in a write must not stop the writer: later saves go on
            log.exception("prompt cache: writing a saved state to %s failed", self.store.folder)
