"""What the Hub says about a file, checked before any of it becomes a path or enters the cache.

The Hub's listing and headers name the cache paths, so every value is validated first: a
content hash is 64 hex digits (sha256, LFS files) or 40 (git blob sha1, other files), a
commit is 40, a file name is repo-relative (no `..`, no absolute path, no backslash, no
empty part). Anything else raises UnsafeHubValue naming the repo, the file and the value.
A file's bytes are hashed while they are written (BlobSink) and enter the cache only by an
atomic rename once size and hash match; a body that does not match is deleted.

    <cache>/models--org--name/
        blobs/<hash>                 verified content, named by its hash
        blobs/<hash>.incomplete      the part downloaded so far (resumed next time)
        snapshots/<commit>/<name>    -> ../../blobs/<hash> (a hard link or copy if no links)
        refs/main                    <commit>
    <cache>/.locks/models--org--name/snug-download.lock   one download of the repo at a time
    <cache>/.locks/models--org--name/<hash>.lock          huggingface_hub's lock on one blob
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HEX40 = re.compile(r"[0-9a-f]{40}")  # a git object id (commit, or blob of a non-LFS file)
HEX64 = re.compile(r"[0-9a-f]{64}")  # the sha256 of an LFS file's content
READ_CHUNK = 1 << 20


class HubFileError(Exception):
    """A file the Hub described or sent cannot be used; the message names repo and file."""


class UnsafeHubValue(HubFileError):
    """A hash, commit or file name from the Hub that must not become a path."""

    def __init__(self, repo: str, name: str, what: str, value: object, rule: str) -> None:
        where = f"{repo}/{name}" if name else repo
        super().__init__(f"{where}: the Hub sent {what} {value!r}, which is not {rule}.")
        self.value = value


class CorruptDownload(HubFileError):
    """The bytes received do not match the size or hash the Hub announced (part deleted)."""


class IncompleteDownload(HubFileError):
    """The body stopped short of the announced size (part kept, resumed next time)."""


class SinkClosed(ValueError):
    """A write into a BlobSink that was closed (a download left behind after a Cancel)."""


def commit_hash(repo: str, value: object) -> str:
    if not isinstance(value, str) or not HEX40.fullmatch(value):
        raise UnsafeHubValue(repo, "", "the commit", value, "a 40-digit hex commit hash")
    return value


def content_hash(repo: str, name: str, value: object, what: str = "the ETag") -> str:
    """A sha256 (64 hex) or git blob sha1 (40 hex), the only names a blob may have."""
    if not isinstance(value, str) or not (HEX64.fullmatch(value) or HEX40.fullmatch(value)):
        raise UnsafeHubValue(repo, name, what, value, "a sha256 or git blob sha1 in hex")
    return value


def repo_name(repo: str, value: object) -> str:
    """A repo-relative file name, returned unchanged when every part is a plain name."""
    if not isinstance(value, str):
        raise UnsafeHubValue(repo, "?", "the file name", value, "a string")
    parts = value.split("/")
    plain = (
        value
        and "\\" not in value
        and not any(ord(c) < 32 or c == ":" for c in value)
        and all(part not in ("", ".", "..") for part in parts)
    )
    if not plain:
        raise UnsafeHubValue(
            repo, value, "the file name", value, "a repo-relative path without '..' or '\\'"
        )
    return value


def byte_count(repo: str, name: str, value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnsafeHubValue(repo, name, what, value, "a byte count")
    return value


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch: its repo-relative name, its hash (the blob's name) and its size."""

    repo: str
    name: str
    digest: str  # sha256 of the content (LFS) or git blob sha1 (40 hex)
    size: int

    def __post_init__(self) -> None:
        repo_name(self.repo, self.name)
        content_hash(self.repo, self.name, self.digest, "the hash")
        assert self.size >= 0

    @property
    def lfs(self) -> bool:
        return len(self.digest) == 64

    def hasher(self) -> hashlib._Hash:
        """sha256 of the content (LFS), or git's blob id: sha1(b"blob <size>\\0" + content)."""
        if self.lfs:
            return hashlib.sha256()
        return hashlib.sha1(b"blob %d\0" % self.size)


def reconcile(
    repo: str,
    name: str,
    etag: str | None,
    head_size: int | None,
    listed_size: int | None,
    listed_sha256: str | None,
    listed_blob: str | None,
) -> RemoteFile:
    """One RemoteFile from the listing (model_info) and the file's headers (HEAD).

    The ETag is the hash (sha256 for LFS files, git blob sha1 otherwise); the listing's hash,
    where it gives one, must agree. A listed size of 0 or None counts as unknown and the
    headers' size is used; a size nobody gives is refused, so the disk check never skips.
    """
    name = repo_name(repo, name)
    digest = content_hash(repo, name, etag)
    if listed_sha256 is not None:
        listed = content_hash(repo, name, listed_sha256, "the listing's sha256")
    elif listed_blob is not None and len(digest) == 40:
        listed = content_hash(repo, name, listed_blob, "the listing's blob id")
    else:
        listed = digest
    if listed != digest:
        raise HubFileError(
            f"{repo}/{name}: the Hub's listing says hash {listed} but its ETag says {digest}; "
            "try again later (the repo may be changing)."
        )
    listed_size = byte_count(repo, name, listed_size, "the listed size")
    head_size = byte_count(repo, name, head_size, "the Content-Length")
    size = listed_size if listed_size else head_size
    if listed_size and head_size is not None and head_size != listed_size:
        raise HubFileError(
            f"{repo}/{name}: the Hub's listing says {listed_size} bytes but its headers say "
            f"{head_size}; try again later."
        )
    if size is None or size < 0:
        raise HubFileError(f"{repo}/{name}: the Hub did not say how large this file is.")
    return RemoteFile(repo, name, digest, int(size))


def file_digest(path: Path, file: RemoteFile, on_read: Callable[[int], None] | None = None) -> str:
    """The file's hash as `file.digest` is computed; `on_read(bytes so far)` after each chunk."""
    h, done = file.hasher(), 0
    with path.open("rb") as src:
        while chunk := src.read(READ_CHUNK):
            h.update(chunk)
            done += len(chunk)
            if on_read is not None:
                on_read(done)
    return h.hexdigest()


class BlobSink:
    """The `.incomplete` file that huggingface_hub's http_get writes into, hashed as it grows.

    It refuses bytes past the announced size, calls `on_write(size)` after every chunk (the
    downloader's progress and Cancel), and `commit()` renames it to its blob name only when
    size and hash match; otherwise the part is deleted so that a retry starts clean. Writes
    and `close()` take turns: once closed (from any thread) no byte more reaches the part.
    """

    def __init__(self, path: Path, file: RemoteFile, on_write: Callable[[int], None]) -> None:
        self.path, self.file, self.on_write = path, file, on_write
        self._gate = threading.RLock()
        if path.exists() and path.stat().st_size > file.size:
            path.unlink()
        self._out = path.open("ab")
        self._out.seek(0, os.SEEK_END)
        self._rehash()

    @property
    def size(self) -> int:
        return self._out.tell()

    def _rehash(self) -> None:
        """Hash what the file holds up to the current position (after open or truncate)."""
        self._hash = self.file.hasher()
        end = self._out.tell()
        with self.path.open("rb") as src:
            while src.tell() < end and (chunk := src.read(min(READ_CHUNK, end - src.tell()))):
                self._hash.update(chunk)

    # The file-object calls http_get makes: write, and tell/seek/truncate when it restarts a
    # download whose Range request the server ignored.
    def write(self, data: bytes) -> int:
        with self._gate:
            if self._out.closed:
                raise SinkClosed(f"{self.file.repo}/{self.file.name}: the download was left")
            if self.size + len(data) > self.file.size:
                self.close()
                self.path.unlink(missing_ok=True)
                raise CorruptDownload(
                    f"{self.file.repo}/{self.file.name}: the Hub sent more than the "
                    f"{self.file.size} bytes it announced; the part was removed, try again."
                )
            self._out.write(data)
            self._hash.update(data)
            size = self.size
        self.on_write(size)
        return len(data)

    def tell(self) -> int:
        return self._out.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._out.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        end = self._out.truncate(size)
        self._out.seek(end)
        self._out.flush()
        self._rehash()
        return end

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        with self._gate:
            if not self._out.closed:
                self._out.close()

    def __enter__(self) -> BlobSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def commit(self, blob: Path) -> None:
        """Rename to `blob` if size and hash match the Hub's; else delete and raise."""
        size = self.size
        got = self._hash.hexdigest()
        self.close()
        f = self.file
        if size == f.size and got == f.digest:
            os.replace(self.path, blob)
            return
        self.path.unlink(missing_ok=True)
        if size != f.size:
            problem = f"{size} bytes arrived, {f.size} were announced"
        else:
            problem = f"the bytes hash to {got}, the Hub says {f.digest}"
        raise CorruptDownload(
            f"{f.repo}/{f.name}: {problem}; the part was removed, download again."
        )


class RepoCache:
    """One repo's folder in the HF cache; every path it hands out stays inside it."""

    def __init__(self, root: Path, repo: str) -> None:
        from huggingface_hub.file_download import repo_folder_name

        folder = repo_folder_name(repo_id=repo, repo_type="model")  # validates the repo id
        self.repo = repo
        self.root = Path(root)
        self.folder = self.root / folder
        self.blobs = self.folder / "blobs"
        self.lock_path = self.root / ".locks" / folder / "snug-download.lock"

    def blob_lock_path(self, file: RemoteFile) -> Path:
        """huggingface_hub's lock on one blob, so that its own downloads take turns with ours."""
        return self.lock_path.with_name(f"{content_hash(self.repo, file.name, file.digest)}.lock")

    def stale_parts(self, keep: set[str]) -> list[Path]:
        """`.incomplete` parts of blobs not in `keep` (files since changed on the Hub)."""
        if not self.blobs.is_dir():
            return []
        digests = ((p, p.name.removesuffix(".incomplete")) for p in self.blobs.glob("*.incomplete"))
        return [
            p for p, d in digests if (HEX40.fullmatch(d) or HEX64.fullmatch(d)) and d not in keep
        ]

    def _inside(self, path: Path) -> Path:
        base = os.path.realpath(self.folder)
        real = os.path.realpath(path.parent)
        if os.path.commonpath([base, real]) != base:
            raise UnsafeHubValue(self.repo, path.name, "a path", str(path), "inside the cache")
        return path

    def blob(self, file: RemoteFile) -> Path:
        self.blobs.mkdir(parents=True, exist_ok=True)
        return self._inside(self.blobs / content_hash(self.repo, file.name, file.digest))

    def partial(self, file: RemoteFile) -> Path:
        return self.blob(file).with_name(f"{file.digest}.incomplete")

    def snapshot(self, commit: str) -> Path:
        return self.folder / "snapshots" / commit_hash(self.repo, commit)

    def verified(self, file: RemoteFile, on_read: Callable[[int], None] | None = None) -> bool:
        """True when the blob is present and its hash matches; a bad blob is deleted."""
        blob = self.blob(file)
        if not blob.is_file():
            return False
        if blob.stat().st_size == file.size and file_digest(blob, file, on_read) == file.digest:
            return True
        blob.unlink()
        return False

    def link(self, commit: str, file: RemoteFile) -> Path:
        """Point `snapshots/<commit>/<name>` at the file's blob (replacing whatever was there)."""
        blob = self.blob(file)
        dst = self.snapshot(commit).joinpath(*repo_name(self.repo, file.name).split("/"))
        dst.parent.mkdir(parents=True, exist_ok=True)
        self._inside(dst)
        target = os.path.relpath(blob, dst.parent)
        if dst.is_symlink() and os.readlink(dst) == target:
            return dst
        tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            os.symlink(target, tmp)
        except (OSError, NotImplementedError):  # Windows without symlink rights
            try:
                os.link(blob, tmp)
            except OSError:
                shutil.copyfile(blob, tmp)
        os.replace(tmp, dst)
        return dst

    def set_ref(self, ref: str, commit: str) -> None:
        path = self.folder / "refs" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{ref}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(commit_hash(self.repo, commit), encoding="utf-8")
        os.replace(tmp, path)
