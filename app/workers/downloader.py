"""Model downloads on their own thread (never the engine thread), into the HF cache.

Each file is fetched into `blobs/<etag>.incomplete` in the standard cache layout and
resumed with an HTTP Range request on the next attempt (after a cut connection, a Cancel
or an app restart); `hf_hub_download` then links the finished blob into the snapshot.
Progress comes from a tqdm class handed to huggingface_hub's `http_get`; Cancel is a
threading.Event that the hook checks on every chunk. DownloadManager (app/controllers.py)
owns the thread and is what the library panel talks to.
"""

from __future__ import annotations

import fnmatch
import shutil
import threading
import time
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

WANTED = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken")
EMIT_EVERY_S = 0.1


class DownloadCancelled(Exception):
    """Raised inside the progress hook to stop huggingface_hub mid-file; parts are kept."""


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
    if isinstance(exc, OSError) and "space" in str(exc).lower():
        return str(exc)
    if "connect" in name.lower() or "timeout" in name.lower() or "protocol" in name.lower():
        return (
            f"Cannot reach the Hugging Face Hub ({name}). Check the network connection; "
            "the parts already downloaded are kept and the download resumes next time."
        )
    return f"{name}: {exc}"


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
        from huggingface_hub import HfApi, hf_hub_download, try_to_load_from_cache
        from huggingface_hub.utils import tqdm as hf_tqdm

        info = HfApi(endpoint=self.endpoint).model_info(repo, revision="main", files_metadata=True)
        files = [
            (s.rfilename, int(s.size or 0)) for s in info.siblings or [] if wanted(s.rfilename)
        ]
        if not any(name.endswith(".safetensors") for name, _ in files):
            raise FileNotFoundError(f"{repo} has no .safetensors weights Snug can read.")
        total = sum(size for _, size in files)
        have = 0
        for name, size in files:
            cached = try_to_load_from_cache(repo, name, cache_dir=self.cache_dir, revision=info.sha)
            if isinstance(cached, str):
                have += size
        self._check_disk(total - have)
        self.started.emit(repo, total)

        state = {"done": have, "file": 0, "last": 0.0, "t0": time.monotonic(), "fresh": 0}

        def report(file_bytes: int, force: bool = False) -> None:
            now = time.monotonic()
            state["file"] = file_bytes
            if force or now - state["last"] >= EMIT_EVERY_S:
                state["last"] = now
                speed = state["fresh"] / max(now - state["t0"], 1e-3)
                self.progress.emit(repo, state["done"] + file_bytes, total, speed)

        class Hook(hf_tqdm):
            def __init__(self, *args, **kwargs):
                kwargs["disable"] = True
                kwargs.pop("name", None)
                super().__init__(*args, **kwargs)
                self._seen = int(kwargs.get("initial", 0) or 0)

            def update(self, n=1):
                if cancel.is_set():
                    raise DownloadCancelled(repo)
                self._seen += int(n or 0)
                state["fresh"] += int(n or 0)
                report(self._seen)
                return super().update(n)

        snapshot = ""
        for name, size in files:
            if cancel.is_set():
                raise DownloadCancelled(repo)
            cached = try_to_load_from_cache(repo, name, cache_dir=self.cache_dir, revision=info.sha)
            if not isinstance(cached, str):
                self._fetch_blob(repo, name, info.sha, Hook)
                state["done"] += size
            # The blob is in place now, so this only links it into the snapshot (and refs).
            path = hf_hub_download(
                repo, name, revision=info.sha, cache_dir=self.cache_dir, endpoint=self.endpoint
            )
            state["file"] = 0
            report(0, force=True)
            if "/" not in name:
                snapshot = str(Path(path).parent)
        return snapshot

    def _fetch_blob(self, repo: str, name: str, revision: str, hook: type) -> None:
        """Download one file to `blobs/<etag>` through a `<etag>.incomplete` file that is kept.

        huggingface_hub deletes its own partial files on failure, so Snug keeps its own: a
        Cancel, a cut connection or a restart continue from where the bytes stopped.
        """
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get, repo_folder_name

        url = hf_hub_url(repo, name, revision=revision, endpoint=self.endpoint)
        meta = get_hf_file_metadata(url, endpoint=self.endpoint)
        if meta.etag is None:
            raise FileNotFoundError(f"{repo}/{name}: the Hub sent no ETag for this file.")
        cache = Path(self.cache_dir or constants.HF_HUB_CACHE)
        blobs = cache / repo_folder_name(repo_id=repo, repo_type="model") / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        blob = blobs / meta.etag
        if blob.exists():
            return
        partial = blobs / f"{meta.etag}.incomplete"
        have = partial.stat().st_size if partial.exists() else 0
        if meta.size is not None and have > meta.size:
            partial.unlink()
            have = 0
        with partial.open("ab") as out:
            http_get(
                meta.location,
                out,
                resume_size=have,
                expected_size=meta.size,
                displayed_filename=name,
                tqdm_class=hook,
            )
        if meta.size is not None and partial.stat().st_size != meta.size:
            raise OSError(
                f"{repo}/{name}: got {partial.stat().st_size} bytes, expected {meta.size}; "
                "try the download again"
            )
        partial.replace(blob)

    def _check_disk(self, needed: int) -> None:
        from huggingface_hub import constants

        target = Path(self.cache_dir or constants.HF_HUB_CACHE)
        probe = target
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        margin = 256 << 20
        if needed + margin > free:
            raise OSError(
                f"Not enough disk space in {target}: this model needs {needed / 2**30:.2f} GiB "
                f"more and {free / 2**30:.2f} GiB is free. Free some space or set HF_HOME to "
                "a larger disk."
            )
