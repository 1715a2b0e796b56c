"""The prompt cache's disk writer: saves snapshots to an engine.snapshot_store.SnapshotStore
on a thread of its own, so that a reply never waits for the disk."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.snapshot_store import HostSnapshot, SnapshotStore

log = logging.getLogger(__name__)

WRITE_QUEUE_DEPTH = 4  # snapshots waiting for the writer; past it a write is skipped


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
