"""Saved stream states on disk: the prompt cache's last tier, so a chat resumes after a restart.

A snapshot is a stream's state at an exact position (KV up to its length, DeltaNet conv and
recurrent state) plus the token ids it holds. On disk each one is two files in the store's
folder, named by a hash of the ids:

    <hash>.safetensors   the state's arrays (bf16 as uint16 bits), written with safetensors
    <hash>.json          what it is: the ids, the model's fingerprint (config.json and the
                         tensor headers), the engine version, the precision, the arrays'
                         names, dtypes and shapes, and a sha256 of the safetensors file

Both are written to temporary names and renamed into place, the JSON last, so a crash or a
full disk mid-write leaves the old cache valid (an entry without its JSON is not an entry).
A file that does not check out (truncated, corrupt, another model, engine version or
precision) is refused with a logged reason and removed; the caller prefills afresh, never
restores a wrong state. Least-recently-used entries are removed past the byte budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the layout of a snapshot changes


@dataclass
class HostSnapshot:
    """A stream's state in host memory: flat names ("kv_k.0", "recurrent.3") -> arrays."""

    length: int
    arrays: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())


@dataclass(frozen=True)
class StoreKey:
    """What a snapshot must match to be restored: the model, the engine and the precision."""

    model: str  # fingerprint: sha256 of config.json and the tensor headers
    engine: str  # the engine's version
    precision: str  # backend and activation type, e.g. "cuda:bfloat16", "numpy:float32"


@dataclass
class _Entry:
    ids: tuple[int, ...]
    nbytes: int
    used: float = field(default_factory=time.time)


def ids_hash(ids: tuple[int, ...] | list[int]) -> str:
    return hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()[:32]


def model_fingerprint(model_dir: str | os.PathLike[str], tensors: dict[str, Any]) -> str:
    """sha256 of config.json's bytes and every tensor's name, shape and dtype."""
    h = hashlib.sha256(Path(model_dir, "config.json").read_bytes())
    for name in sorted(tensors):
        info = tensors[name]
        h.update(f"{name}:{tuple(info.shape)}:{info.dtype};".encode())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


class SnapshotStore:
    """A folder of snapshots for one (model, engine, precision), bounded by `budget_bytes`."""

    def __init__(self, folder: str | os.PathLike[str], key: StoreKey, budget_bytes: int):
        self.folder = Path(folder)
        self.key = key
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: dict[str, _Entry] = {}
        self.folder.mkdir(parents=True, exist_ok=True)
        self._scan()

    # ----- index -----------------------------------------------------------------------------
    def _scan(self) -> None:
        """Index the entries whose JSON names this model, engine and precision; remove what
        an interrupted save left (temporary files, data without its index)."""
        for leftover in self.folder.glob("*.tmp"):
            leftover.unlink(missing_ok=True)
        for data in self.folder.glob("*.safetensors"):
            if not data.with_suffix(".json").exists():
                data.unlink(missing_ok=True)
        for meta_path in self.folder.glob("*.json"):
            try:
                meta = json.loads(meta_path.read_text())
                if not self._matches(meta):
                    continue
                ids = tuple(int(i) for i in meta["ids"])
                if ids_hash(ids) != meta_path.stem:
                    raise ValueError("the ids do not hash to the file's name")
                used = meta_path.stat().st_mtime
                self._entries[meta_path.stem] = _Entry(ids, int(meta["nbytes"]), used)
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                self._refuse(meta_path.stem, f"unreadable index ({type(exc).__name__}: {exc})")

    def _matches(self, meta: dict) -> bool:
        return (
            meta.get("format") == FORMAT
            and meta.get("model") == self.key.model
            and meta.get("engine") == self.key.engine
            and meta.get("precision") == self.key.precision
        )

    @property
    def held_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int]) -> tuple[int, ...] | None:
        """The ids of the longest entry that is a proper prefix of `prompt`, or None."""
        best: tuple[int, ...] | None = None
        for entry in self._entries.values():
            ids = entry.ids
            if len(ids) < len(prompt) and tuple(prompt[: len(ids)]) == ids:
                if best is None or len(ids) > len(best):
                    best = ids
        return best

    # ----- write -----------------------------------------------------------------------------
    def save(self, ids: list[int], snapshot: HostSnapshot) -> bool:
        """Write one snapshot atomically; False (logged) when it cannot be kept."""
        from safetensors.numpy import save_file

        key = tuple(int(i) for i in ids)
        nbytes = snapshot.nbytes
        if not key or nbytes > self.budget_bytes:
            return False
        name = ids_hash(key)
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
                "sha256": _file_sha256(tmp_data),
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
        self._entries.pop(name, None)
        for suffix in (".json", ".safetensors"):  # the JSON first: no half entry is indexed
            (self.folder / f"{name}{suffix}").unlink(missing_ok=True)

    def _refuse(self, name: str, why: str) -> None:
        log.warning("prompt cache: refusing saved state %s: %s; it is removed", name, why)
        self.remove(name)

    # ----- read ------------------------------------------------------------------------------
    def load(self, ids: tuple[int, ...]) -> HostSnapshot | None:
        """The snapshot saved for exactly `ids`, or None (logged) when it does not check
        out: the caller then prefills afresh."""
        from safetensors.numpy import load_file

        name = ids_hash(ids)
        data, meta_path = self.folder / f"{name}.safetensors", self.folder / f"{name}.json"
        try:
            meta = json.loads(meta_path.read_text())
            if not self._matches(meta) or tuple(meta["ids"]) != tuple(ids):
                self._refuse(name, "it was saved for another model, engine or precision")
                return None
            if _file_sha256(data) != meta["sha256"]:
                self._refuse(name, "its data does not match its checksum (corrupt or truncated)")
                return None
            arrays = load_file(str(data))
            want = {k: (dt, tuple(shape)) for k, (dt, shape) in meta["arrays"].items()}
            got = {k: (str(v.dtype), tuple(v.shape)) for k, v in arrays.items()}
            if got != want:
                self._refuse(name, "its arrays are not the ones its index lists")
                return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self._refuse(name, f"it cannot be read ({type(exc).__name__}: {exc})")
            return None
        entry = self._entries.get(name)
        if entry is not None:
            entry.used = time.time()
        os.utime(meta_path)
        return HostSnapshot(int(meta["length"]), arrays)

    def clear(self) -> None:
        for name in list(self._entries):
            self.remove(name)
