"""Model downloads on their own thread (never the engine thread), into the HF cache.

Every path comes from a validated hash or name (app/workers/hub_files.py). One download of
a repo at a time per cache: a file lock (`.locks/models--org--name/snug-download.lock`)
makes a second one, from this app or another, wait and then find the files in place. Each
file is fetched by huggingface_hub's `http_get` into `blobs/<hash>.incomplete`, hashed while
it is written and renamed to `blobs/<hash>` only when the hash matches; the part is kept
after a cut connection, a Cancel or a restart, and resumed with an HTTP Range request. A
blob already in the cache is hashed again before it is used, so a damaged one is replaced.
DownloadManager (app/controllers.py) owns the thread and is what the library panel talks to.
"""

from __future__ import annotations

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
    commit_hash,
    reconcile,
    repo_name,
)

WANTED = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken")
EMIT_EVERY_S = 0.1
LOCK_POLL_S = 0.2
DISK_MARGIN = 256 << 20


class DownloadCancelled(Exception):
    """Raised from the write path to stop huggingface_hub mid-file; parts are kept."""


class NotEnoughDisk(OSError):
    """The cache's disk has less free space than the files still to fetch need."""


def wanted(filename: str) -> bool:
    return any(fnmatch.fnmatch(filename.rsplit("/", 1)[-1], p) for p in WANTED)


def explain(exc: BaseException, repo: str) -> str:
    """A sentence for the UI: what went wrong and what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = type(exc).__name__
    if isinstance(exc, GatedRepoError):
        return f"{repo} is gated: accept its licence on huggingface.co and log in first."
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"{repo} was not found on the Hugging Face Hub (check the name, or log in if private)."
        )
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no 'main' revision on the Hub."
    if isinstance(exc, OfflineModeIsEnabled):
        return "Offline mode is on (HF_HUB_OFFLINE); unset it to download models."
    if isinstance(exc, HfHubHTTPError):
        return f"The Hub answered with an error for {repo}: {exc}"
    if isinstance(exc, HubFileError | NotEnoughDisk):
        return str(exc)
    if isinstance(exc, OSError) and "space" in str(exc).lower():
        return str(exc)
    if "connect" in name.lower() or "timeout" in name.lower() or "protocol" in name.lower():
        return (
            f"Cannot reach the Hugging Face Hub ({name}). Check the network connection; "
            "the parts already downloaded are kept and the download resumes next time."
        )
    return f"{name}: {exc}"


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

    @Slot(str, object)
    def download(self, repo: str, cancel: threading.Event) -> None:
        try:
            folder = self._download(repo, cancel)
        except DownloadCancelled:
            self.cancelled.emit(repo)
        except Exception as exc:  # every failure becomes a message in the library panel
            self.failed.emit(repo, explain(exc, repo))
        else:
            self.finished.emit(repo, folder)

    def _download(self, repo: str, cancel: threading.Event) -> str:
        from filelock import FileLock, Timeout
        from huggingface_hub import HfApi, constants

        cache = RepoCache(Path(self.cache_dir or constants.HF_HUB_CACHE), repo)
        info = HfApi(endpoint=self.endpoint).model_info(repo, revision="main", files_metadata=True)
        commit = commit_hash(repo, info.sha)
        # Unwanted names never become paths, so only wanted ones need to be valid.
        listed = [s for s in info.siblings or [] if wanted(str(s.rfilename))]
        for s in listed:
            repo_name(repo, s.rfilename)
        if not any(s.rfilename.endswith(".safetensors") for s in listed):
            raise FileNotFoundError(f"{repo} has no .safetensors weights Snug can read.")

        cache.lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(cache.lock_path)
        while True:  # wait for another download of this repo, but honour Cancel meanwhile
            if cancel.is_set():
                raise DownloadCancelled(repo)
            try:
                lock.acquire(timeout=LOCK_POLL_S)
                break
            except Timeout:
                continue
        try:
            return self._download_locked(repo, cache, commit, listed, cancel)
        finally:
            lock.release()

    def _download_locked(
        self, repo: str, cache: RepoCache, commit: str, listed: list, cancel: threading.Event
    ) -> str:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        files, where = [], {}
        for s in listed:
            url = hf_hub_url(repo, s.rfilename, revision=commit, endpoint=self.endpoint)
            meta = get_hf_file_metadata(url, endpoint=self.endpoint)
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
            where[file.name] = meta.location
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
                self._fetch(cache, file, where[file.name], progress, cancel)
            progress.done += file.size
            progress.file(0, force=True)
            cache.link(commit, file)
        cache.set_ref("main", commit)
        return str(cache.snapshot(commit))

    def _fetch(
        self,
        cache: RepoCache,
        file: RemoteFile,
        url: str,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        """Fetch one file into its `.incomplete` part (resumed) and rename it once verified."""
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
            try:
                http_get(
                    url,
                    sink,
                    resume_size=sink.size,
                    headers=build_hf_headers(headers={"Accept-Encoding": "identity"}),
                    expected_size=file.size,
                    displayed_filename=file.name,
                    tqdm_class=Quiet,
                )
            except OSError as exc:
                if exc.errno is None and sink.size < file.size:  # the body stopped short
                    raise IncompleteDownload(
                        f"{file.repo}/{file.name}: the Hub sent {sink.size} of {file.size} "
                        "bytes; the part is kept, download again to resume."
                    ) from exc
                raise
            sink.commit(cache.blob(file))

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
