"""A prompt-cache folder's files (engine.snapshot_store): which of them are saved states,
their sizes, the lock file the engines and `snug cache` using the folder share, and
`snug cache clear`'s removal of every saved state (or one model's). Nothing else in the
folder is read, counted or removed."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

log = logging.getLogger(__name__)

LOCK_NAME = ".snug-cache.lock"  # no saved state's name: `snug cache clear` leaves it
LOCK_WAIT_S = 30.0  # past it (another engine's save hung on the disk) a save is skipped


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


def files_size(folder: Path, name: str) -> int:
    """Bytes of an entry's files (0 for one that is gone: another engine evicted it)."""
    total = 0
    for suffix in (".json", ".safetensors"):
        try:
            total += (folder / f"{name}{suffix}").stat().st_size
        except OSError:
            pass
    return total


def unlink(path: Path) -> bool:
    """Remove a file; False (logged, naming it) where it cannot be (a read-only folder, a
    file another program holds open on Windows): a restore or a save never fails on it."""
    try:
        path.unlink(missing_ok=True)
        return True
    except OSError as exc:
        log.warning("prompt cache: could not remove %s (%s)", path, exc)
        return False


@contextlib.contextmanager
def folder_lock(
    folder: Path, wait: float = LOCK_WAIT_S, level: int = logging.WARNING
) -> Iterator[bool]:
    """Hold `folder`'s lock file (LOCK_NAME) against the other engines and `snug cache`
    using the folder: True while held; False (logged at `level`) where it could not be had
    in `wait` seconds or made (a read-only folder), and the caller does without what needs
    it."""
    from filelock import FileLock, Timeout

    lock = FileLock(folder / LOCK_NAME, timeout=wait)
    try:
        lock.acquire()
    except (Timeout, OSError) as exc:
        log.log(level, "prompt cache: could not lock %s (%s)", folder, exc)
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


class Cleared(NamedTuple):
    """What `clear_folder` did: entries and bytes removed, and the entries it could not
    remove (a read-only folder, a file another program holds open on Windows)."""

    count: int
    nbytes: int
    kept: int


def clear_folder(folder: str | os.PathLike[str], model: str | None = None) -> Cleared:
    """Remove the saved states in `folder` (only those of the model with fingerprint `model`
    when given), and what interrupted saves left. Under the folder's lock: a save in flight
    in an engine using the folder finishes first (its temporary files are not leftovers);
    where the lock cannot be had, only whole entries go. An entry counts as removed once
    both its files are gone; one whose file could not be removed is counted in `kept`."""
    folder = Path(folder)
    if not folder.is_dir():
        return Cleared(0, 0, 0)
    count = removed = kept = 0
    with folder_lock(folder) as held:
        for meta_path in state_files(folder, "*.json"):
            if model is not None:
                try:
                    if json.loads(meta_path.read_text()).get("model") != model:
                        continue
                except (OSError, ValueError, AttributeError, RecursionError):
                    continue  # not readable: not known to be this model's
            size = files_size(folder, meta_path.stem)
            paths = [folder / f"{meta_path.stem}{suffix}" for suffix in (".json", ".safetensors")]
            if all(unlink(path) for path in paths):  # the JSON first, as a store removes
                removed += size
                count += 1
            else:
                kept += 1
        if model is None and held:
            for leftover in (*state_files(folder, "*.tmp"), *state_files(folder, "*.safetensors")):
                if leftover.with_suffix(".json").exists():
                    continue  # an entry kept above: said once
                with contextlib.suppress(OSError):
                    size = leftover.stat().st_size
                    if unlink(leftover):
                        removed += size
    return Cleared(count, removed, kept)
