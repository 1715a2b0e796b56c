"""Model downloads on their own thread (never the engine thread), into the HF cache.

Every path comes from a validated hash or name (app/workers/hub_files.py). One download of
a repo at a time per cache: a file lock (`.locks/models--org--name/snug-download.lock`)
makes a second one, from this app or another, wait and then find the files in place. Each
file is fetched by huggingface_hub's `http_get` into `blobs/<hash>.incomplete`, hashed while
it is written and renamed to `blobs/<hash>` only when the hash matches; the part is kept
after a cut connection, a Cancel or a restart, and resumed with an HTTP Range request. A
blob already in the cache is hashed again before it is used, so a damaged one is replaced.
The snapshot folder is linked and `refs/main` written only once every file is in place, so
an interrupted download never looks like a complete model.

Every call to the network runs on a helper thread (`interruptible`) that the download
thread watches: Cancel and quitting end the download at once, even while the Hub does not
answer; the call left behind ends on its own timeout and writes nothing more. Each file's
link is asked for again just before it is fetched, since the Hub's signed links expire.
DownloadManager (app/controllers.py) owns the thread and is what the library panel talks to.
"""

from __future__ import annotations

import errno
import fnmatch
import shutil
import threading
import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.workers.hub_files import (
    BlobSink,
    HubFileError,
    IncompleteDownload,
    RemoteFile,
    RepoCache,
    SinkClosed,
    commit_hash,
    reconcile,
    repo_name,
)

WANTED = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken")
EMIT_EVERY_S = 0.1
LOCK_POLL_S = 0.2
CANCEL_POLL_S = 0.05
LINK_TRIES = 3  # a refused signed link is asked for again this many times in all
DISK_MARGIN = 256 << 20
DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS}
NOT_A_FOLDER = {errno.ENOTDIR, errno.EEXIST}
LOGIN = (
    "log in with `hf auth login` (or set HF_TOKEN to a token from huggingface.co/settings/tokens)"
)


class DownloadCancelled(Exception):
    """Raised from the write path to stop huggingface_hub mid-file; parts are kept."""


class NotEnoughDisk(OSError):
    """The cache's disk has less free space than the files still to fetch need."""


def wanted(filename: str) -> bool:
    return any(fnmatch.fnmatch(filename.rsplit("/", 1)[-1], p) for p in WANTED)


def interruptible(call, cancel: threading.Event, repo: str):
    """`call()` on a helper thread; its result, or DownloadCancelled as soon as `cancel` is set.

    A call left behind ends on its own (every one has a timeout) and its result is dropped.
    """
    box: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the download thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="snug-download-io", daemon=True).start()
    while not done.wait(CANCEL_POLL_S):
        if cancel.is_set():
            raise DownloadCancelled(repo)
    if "error" in box:
        raise box["error"]
    return box["value"]


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def explain(exc: BaseException, repo: str, cache: Path | None = None) -> str:
    """A sentence for the UI: what went wrong and what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = type(exc).__name__
    status = _status(exc)
    if isinstance(exc, GatedRepoError):
        return (
            f"{repo} is gated: accept its licence on its page on huggingface.co, then {LOGIN}, "
            "and download again."
        )
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"{repo} was not found on the Hugging Face Hub: check the name, or if it is "
            f"private, {LOGIN}."
        )
    if isinstance(exc, RevisionNotFoundError):
        return (
            f"{repo}: the revision asked for is not on the Hub (the repository changed); "
            "download again to get its current files."
        )
    if isinstance(exc, RemoteEntryNotFoundError):
        return (
            f"{repo}: a file is no longer on the Hub (the repository changed while "
            "downloading); download again to get its current files."
        )
    if isinstance(exc, OfflineModeIsEnabled):
        return (
            f"Cannot download {repo}: offline mode is on (HF_HUB_OFFLINE). Models already "
            "downloaded still load; unset HF_HUB_OFFLINE to download."
        )
    if isinstance(exc, HfHubHTTPError) and status in (401, 403):
        return f"The Hub refused {repo} ({status}): it needs a login; {LOGIN}."
    if isinstance(exc, HfHubHTTPError):
        return f"The Hub answered with an error for {repo}: {exc}"
    if isinstance(exc, HubFileError | NotEnoughDisk):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno is not None:
        where = cache if cache is not None else exc.filename
        if exc.errno in DISK_FULL:
            return (
                f"The disk holding the Hugging Face cache ({where}) is full while downloading "
                f"{repo}. Free some space or set HF_HOME to a larger disk, then download "
                "again: the parts already downloaded are kept."
            )
        if exc.errno in READ_ONLY:
            return (
                f"Cannot write to the Hugging Face cache ({where}) to download {repo}: "
                f"{exc.strerror} ({exc.filename or where}). Make that folder writable, or set "
                "HF_HUB_CACHE (or HF_HOME) to a folder you can write; models already "
                "downloaded still load."
            )
        if exc.errno in NOT_A_FOLDER:
            return (
                f"The Hugging Face cache ({where}) cannot hold {repo}: {exc.filename} is "
                "not a folder. Set HF_HUB_CACHE (or HF_HOME) to a folder."
            )
    if "connect" in name.lower() or "timeout" in name.lower() or "protocol" in name.lower():
        return (
            f"Cannot reach the Hugging Face Hub ({name}). Check the network connection; the "
            f"parts of {repo} already downloaded are kept and the download resumes next time."
        )
    return f"{repo}: {name}: {exc}"


class Progress:
    """Bytes done over the whole download, emitted at most every EMIT_EVERY_S."""

    def __init__(self, emit, repo: str, total: int) -> None:
        self.emit, self.repo, self.total = emit, repo, total
        self.done = 0  # bytes of finished files
        self.fresh = 0  # bytes received in this run (the speed)
        self.t0 = time.monotonic()
        self.last = 0.0

    def file(self, file_bytes: int, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= EMIT_EVERY_S:
            self.last = now
            speed = self.fresh / max(now - self.t0, 1e-3)
            self.emit(self.repo, self.done + file_bytes, self.total, speed)


class DownloadWorker(QObject):
    """Lives on the download thread; one download at a time."""

    started = Signal(str, object)  # repo, total bytes (object: may exceed 32 bits)
    progress = Signal(str, object, object, float)  # repo, done bytes, total bytes, bytes/s
    finished = Signal(str, str)  # repo, snapshot folder
    failed = Signal(str, str)  # repo, message
    cancelled = Signal(str)

    def __init__(self, cache_dir: str | None, endpoint: str | None) -> None:
        super().__init__()
        self.cache_dir = cache_dir
        self.endpoint = endpoint

    def _root(self) -> Path:
        from huggingface_hub import constants

        return Path(self.cache_dir or constants.HF_HUB_CACHE)

    @Slot(str, object)
    def download(self, repo: str, cancel: threading.Event) -> None:
        try:
            folder = self._download(repo, cancel)
        except DownloadCancelled:
            self.cancelled.emit(repo)
        except Exception as exc:  # every failure becomes a message in the library panel
            self.failed.emit(repo, explain(exc, repo, self._root()))
        else:
            self.finished.emit(repo, folder)

    def _download(self, repo: str, cancel: threading.Event) -> str:
        from filelock import FileLock
        from huggingface_hub import HfApi, constants

        cache = RepoCache(self._root(), repo)
        api = HfApi(endpoint=self.endpoint)
        info = interruptible(
            lambda: api.model_info(
                repo, revision="main", files_metadata=True, timeout=constants.HF_HUB_ETAG_TIMEOUT
            ),
            cancel,
            repo,
        )
        commit = commit_hash(repo, info.sha)
        # Unwanted names never become paths, so only wanted ones need to be valid.
        listed = [s for s in info.siblings or [] if wanted(str(s.rfilename))]
        for s in listed:
            repo_name(repo, s.rfilename)
        if not any(s.rfilename.endswith(".safetensors") for s in listed):
            raise FileNotFoundError(f"{repo} has no .safetensors weights Snug can read.")

        cache.lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(cache.lock_path)
        _acquire(lock, cancel, repo)  # another download of this repo goes first
        try:
            return self._download_locked(repo, cache, commit, listed, cancel)
        finally:
            lock.release()

    def _head(self, repo: str, name: str, commit: str, cancel: threading.Event):
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(repo, name, revision=commit, endpoint=self.endpoint)
        head = lambda: get_hf_file_metadata(url, endpoint=self.endpoint)  # noqa: E731
        return interruptible(head, cancel, repo)

    def _download_locked(
        self, repo: str, cache: RepoCache, commit: str, listed: list, cancel: threading.Event
    ) -> str:
        files = []
        for s in listed:
            meta = self._head(repo, s.rfilename, commit, cancel)
            lfs = s.lfs
            file = reconcile(
                repo,
                s.rfilename,
                meta.etag,
                meta.size,
                (lfs.size if lfs else s.size),
                (lfs.sha256 if lfs else None),
                (None if lfs else s.blob_id),
            )
            files.append(file)
        missing = [f for f in files if not cache.blob(f).is_file()]
        parts = sum(min(_size(cache.partial(f)), f.size) for f in missing)
        self._check_disk(cache.root, sum(f.size for f in missing) - parts)
        total = sum(f.size for f in files)
        self.started.emit(repo, total)

        progress = Progress(self.progress.emit, repo, total)

        def hashed(size: int) -> None:  # a blob already here is checked before it is used
            if cancel.is_set():
                raise DownloadCancelled(repo)
            progress.file(size)

        for file in files:
            if cancel.is_set():
                raise DownloadCancelled(repo)
            if not cache.verified(file, hashed):
                self._fetch_fresh(cache, commit, file, progress, cancel)
            progress.done += file.size
            progress.file(0, force=True)
        for file in files:  # the snapshot appears only once every file is in place
            cache.link(commit, file)
        cache.set_ref("main", commit)
        _drop_stale_parts(cache, {f.digest for f in files})
        return str(cache.snapshot(commit))

    def _fetch_fresh(
        self,
        cache: RepoCache,
        commit: str,
        file: RemoteFile,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        """Fetch one file from a link asked for just now; a refused link is asked for again."""
        from filelock import FileLock
        from huggingface_hub.errors import HfHubHTTPError

        lock = FileLock(cache.blob_lock_path(file))
        _acquire(lock, cancel, file.repo)  # huggingface_hub's own downloads of this blob
        try:
            for attempt in range(1, LINK_TRIES + 1):
                meta = self._head(file.repo, file.name, commit, cancel)
                if meta.etag != file.digest:
                    raise HubFileError(
                        f"{file.repo}/{file.name} changed on the Hub while downloading; "
                        "download again to get its current version."
                    )
                try:
                    return self._fetch(cache, file, meta.location, progress, cancel)
                except HfHubHTTPError as exc:
                    if _status(exc) not in (401, 403, 410) or attempt == LINK_TRIES:
                        raise
        finally:
            lock.release()

    def _fetch(
        self,
        cache: RepoCache,
        file: RemoteFile,
        url: str,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        """Fetch one file into its `.incomplete` part (resumed) and rename it once verified."""
        from huggingface_hub.errors import HfHubHTTPError
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers
        from huggingface_hub.utils import tqdm as hf_tqdm

        class Quiet(hf_tqdm):  # progress goes through BlobSink.on_write, not a bar
            def __init__(self, *args, **kwargs):
                kwargs["disable"] = True
                kwargs.pop("name", None)
                super().__init__(*args, **kwargs)

        seen = {"last": -1}

        def on_write(size: int) -> None:
            if cancel.is_set():
                raise DownloadCancelled(file.repo)
            if seen["last"] >= 0:
                progress.fresh += max(size - seen["last"], 0)
            seen["last"] = size
            progress.file(size)

        with BlobSink(cache.partial(file), file, on_write) as sink:
            seen["last"] = sink.size
            headers = build_hf_headers(headers={"Accept-Encoding": "identity"})
            try:
                interruptible(
                    lambda: http_get(
                        url,
                        sink,
                        resume_size=sink.size,
                        headers=headers,
                        expected_size=file.size,
                        displayed_filename=file.name,
                        tqdm_class=Quiet,
                    ),
                    cancel,
                    file.repo,
                )
                sink.commit(cache.blob(file))
            except (DownloadCancelled, HfHubHTTPError, SinkClosed):
                raise
            except OSError as exc:
                kept = _size(cache.partial(file))
                if exc.errno in DISK_FULL:
                    raise NotEnoughDisk(
                        f"The disk holding the Hugging Face cache ({cache.root}) is full: "
                        f"{file.repo}/{file.name} stopped at {kept} of {file.size} bytes. "
                        "Free some space or set HF_HOME to a larger disk, then download again: "
                        "the part is kept and resumes."
                    ) from exc
                if exc.errno is None and kept < file.size:  # the body stopped short
                    raise IncompleteDownload(
                        f"{file.repo}/{file.name}: the Hub sent {kept} of {file.size} "
                        "bytes; the part is kept, download again to resume."
                    ) from exc
                raise

    def _check_disk(self, target: Path, needed: int) -> None:
        probe = target
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if needed + DISK_MARGIN > free:
            raise NotEnoughDisk(
                f"Not enough disk space in {target}: this model needs {needed / 2**30:.2f} GiB "
                f"more and {free / 2**30:.2f} GiB is free. Free some space or set HF_HOME to "
                "a larger disk."
            )


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _acquire(lock, cancel: threading.Event, repo: str) -> None:
    """Wait for a file lock, honouring Cancel meanwhile."""
    from filelock import Timeout

    while True:
        if cancel.is_set():
            raise DownloadCancelled(repo)
        try:
            lock.acquire(timeout=LOCK_POLL_S)
            return
        except Timeout:
            continue


def _drop_stale_parts(cache: RepoCache, keep: set[str]) -> None:
    """Delete parts of files that changed on the Hub since; one another download is
    writing (it holds huggingface_hub's lock on the blob) is left alone."""
    from filelock import FileLock, Timeout

    for part in cache.stale_parts(keep):
        digest = part.name.removesuffix(".incomplete")
        lock = FileLock(cache.lock_path.with_name(f"{digest}.lock"))
        try:
            with lock.acquire(timeout=0):
                part.unlink(missing_ok=True)
        except (Timeout, OSError):
            continue
