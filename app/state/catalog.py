"""The model library: catalog entries, models in the Hugging Face cache, local folders."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, Signal

from app.paths import resource
from engine.checkpoint.checkpoint import model_name
from engine.checkpoint.header import MAX_HEADER_BYTES
from engine.model_config import parse_config

FOLDERS_KEY = "library/folders"  # the local folders the user added (a JSON list)
REPOS_KEY = "library/repos"  # repositories added from the Hub: [{repo, name, size, config}]


class FolderRefused(ValueError):
    """A folder added as a model is not one; the message names the folder and what lacks."""


@dataclass(frozen=True)
class Entry:
    """One row of the library. `local_dir` is set once the weights are on disk."""

    key: str
    name: str
    quant: str  # "4-bit", "bf16", or "" when unknown
    size_bytes: int
    source: str  # "catalog" | "hub" (added by its repository id) | "cache" | "folder"
    repo: str | None = None
    shape: str | None = None
    fmt: str | None = None  # "mlx4" | "bf16"
    group_size: int = 64
    local_dir: str | None = None
    revisions: tuple[str, ...] = ()
    problem: str = ""  # why the files in the cache cannot be loaded (an interrupted download)

    @property
    def downloaded(self) -> bool:
        return self.local_dir is not None

    @property
    def title(self) -> str:
        return f"{self.name} · {self.quant}" if self.quant else self.name


def load_catalog(path: Path | None = None) -> tuple[list[Entry], dict[str, dict]]:
    raw = json.loads((path or resource("catalog.json")).read_text(encoding="utf-8"))
    entries = [
        Entry(
            key=m["id"],
            name=m["name"],
            quant=m["quant"],
            size_bytes=int(m["size_bytes"]),
            source="catalog",
            repo=m["repo"],
            shape=m["shape"],
            fmt=m["format"],
            group_size=int(m.get("group_size") or 64),
        )
        for m in raw["models"]
    ]
    return entries, dict(raw.get("shapes", {}))


FINISH = "Download finishes it, keeping what is there."


def snapshot_problem(folder: Path) -> str:
    """'' when a snapshot holds a whole model; else what is missing or cut short, and what
    to do. Weights are checked against their safetensors header (a truncated file is short
    of the bytes its header announces) and the shards an index names must all be there."""
    if not (folder / "config.json").is_file():
        return f"config.json is missing from {folder}. {FINISH}"
    for link in sorted(folder.iterdir()):
        if not link.exists():  # a link whose blob was deleted
            return f"{link.name} is missing (its file in the cache was deleted). {FINISH}"
    weights = sorted(folder.glob("*.safetensors"))
    for index in folder.glob("*.safetensors.index.json"):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"{index.name} cannot be read. {FINISH}"
        absent = sorted(str(n) for n in shards if not (folder / str(n)).is_file())
        if absent:
            return f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} missing. {FINISH}"
    if not weights:
        return f"No *.safetensors weights in {folder}. {FINISH}"
    for path in weights:
        short = _short_by(path)
        if short:
            return f"{path.name} is cut short by {short:,} bytes (a download stopped). {FINISH}"
    return ""


def _short_by(path: Path) -> int:
    """Bytes a safetensors file lacks of what its header announces (0: none, or a header
    that is not one; the loader says what is wrong with those)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return 8 - len(head)
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES or f.read(1) != b"{":
                return 0
            if 8 + n > size:
                return 8 + n - size
            f.seek(8)
            header = json.loads(f.read(n))
        ends = [
            v["data_offsets"][1]
            for k, v in header.items()
            if k != "__metadata__" and isinstance(v, dict)
        ]
        end = 8 + n + max((e for e in ends if isinstance(e, int)), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return 0
    return max(end - size, 0)


def _broken_repos(cache_dir: str | None, warnings: list) -> dict[str, Path]:
    """{repo: its newest snapshot} of repos huggingface_hub skipped as corrupted (a link
    whose blob is gone)."""
    from huggingface_hub import constants

    root = Path(cache_dir or constants.HF_HUB_CACHE)
    found: dict[str, Path] = {}
    for warning in warnings:
        folder = next((p for p in Path(str(warning)).parts if p.startswith("models--")), None)
        snaps = root / folder / "snapshots" if folder else None
        if snaps is None or not snaps.is_dir():
            continue
        newest = max(snaps.iterdir(), key=lambda p: p.stat().st_mtime, default=None)
        if newest is not None:
            found[folder.removeprefix("models--").replace("--", "/", 1)] = newest
    return found


def scan_cache(cache_dir: str | None = None) -> tuple[dict[str, tuple], str]:
    """{repo: (snapshot dir, bytes on disk, revision hashes, problem)}: each repo's newest
    complete snapshot (problem ''), or, where none is complete, its newest one and what it
    lacks (snapshot_problem). Returns an error sentence instead of raising when the cache
    cannot be read."""
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir(cache_dir)
    except Exception as exc:  # missing or damaged cache: the library still shows the catalog
        if type(exc).__name__ == "CacheNotFound":
            return {}, ""  # nothing downloaded yet
        return {}, f"{type(exc).__name__}: {exc}"
    found: dict[str, tuple] = {}
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        revs = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
        hashes = tuple(r.commit_hash for r in repo.revisions)
        for rev in revs:
            problem = snapshot_problem(Path(rev.snapshot_path))
            if not problem or repo.repo_id not in found:
                found[repo.repo_id] = (str(rev.snapshot_path), repo.size_on_disk, hashes, problem)
            if not problem:
                break
    for repo_id, snap in _broken_repos(cache_dir, info.warnings).items():
        found.setdefault(repo_id, (str(snap), 0, (), snapshot_problem(snap)))
    return found, ""


def _config(folder: str) -> dict:
    """The folder's config.json, or {} where it cannot be read."""
    try:
        raw = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _is_qwen35(folder: str) -> bool:
    return _qwen35_config(_config(folder))


def _qwen35_config(config: dict) -> bool:
    kind = str(config.get("model_type", ""))
    return kind.startswith("qwen3_5") and "moe" not in kind


def _quant(config: dict) -> str:
    """'4-bit', 'bf16'... as a config says (app/workers/hub_probe.py)."""
    from app.workers.hub_probe import format_of

    return format_of(config)[0]


def check_model_folder(folder: str | Path) -> None:
    """Raise FolderRefused unless `folder` holds a Qwen3.5 config.json and *.safetensors."""
    path = Path(folder)
    if not path.is_dir():
        raise FolderRefused(f"{path} is not a folder.")
    missing = []
    config = path / "config.json"
    if not config.is_file():
        missing.append("config.json (the model's configuration)")
    else:
        try:
            raw = json.loads(config.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError("the file does not hold a JSON object")
            parse_config(raw, source=str(config))
        except Exception as exc:  # OSError, JSON errors, ConfigError
            raise FolderRefused(
                f"{path} is not a Qwen3.5 model folder: its config.json cannot be read as a "
                f"Qwen3.5 config ({exc})."
            ) from exc
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors weight files")
    if missing:
        raise FolderRefused(f"{path} is not a model folder: it has no {' and no '.join(missing)}.")


def folder_size(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors") if p.exists())


class Library(QObject):
    """Catalog + cache + folders. Emits `changed` after every rescan."""

    changed = Signal()

    def __init__(
        self,
        cache_dir: str | None = None,
        catalog_path: Path | None = None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.cache_dir = cache_dir
        self._catalog, self.shapes = load_catalog(catalog_path)
        self._folders: list[str] = []
        self._repos: list[Entry] = []  # added from the Hub, planned from their config
        self._store: QSettings | None = None
        self._entries: list[Entry] = []
        self.scan_error = ""
        self.rescan()

    def entries(self) -> list[Entry]:
        return list(self._entries)

    def find(self, key: str) -> Entry | None:
        return next((e for e in self._entries if e.key == key), None)

    def title_of(self, folder: str) -> str:
        """The model in `folder` as the library names it (its entry's title), else the
        folder's name (`engine.checkpoint.checkpoint.model_name`)."""
        entry = next((e for e in self._entries if e.local_dir == folder), None)
        return entry.title if entry is not None else model_name(folder)

    def add_folder(self, folder: str) -> Entry:
        """Add a local model folder; raises FolderRefused (with the reason) when it is not one."""
        folder = str(Path(folder).resolve())
        check_model_folder(folder)
        if folder not in self._folders:
            self._folders.append(folder)
            self._save_folders()
        self.rescan()
        return next(e for e in self._entries if e.local_dir == folder)

    def folders(self) -> list[str]:
        return list(self._folders)

    def add_repo(self, repo: str, config: dict, weight_bytes: int) -> Entry:
        """A Hub repository (checked by app/workers/hub_probe.py) as an entry to download,
        planned from its `config` like a catalog model; kept in the list across restarts."""
        entry = next((e for e in self._entries if e.repo == repo), None)
        if entry is not None:  # in the catalog or the cache already
            return entry
        self._remember_repo(repo, config, weight_bytes)
        self._save_repos()
        self.rescan()
        return next(e for e in self._entries if e.repo == repo)

    def _remember_repo(self, repo: str, config: dict, weight_bytes: int) -> None:
        from app.workers.hub_probe import format_of

        quant, fmt, group = format_of(config)
        shape = f"hub:{repo}"
        self.shapes[shape] = config  # what the planner reads (and what is saved)
        self._repos.append(
            Entry(
                key=f"hub:{repo}",
                name=repo.split("/")[-1],
                quant=quant,
                size_bytes=int(weight_bytes),
                source="hub",
                repo=repo,
                shape=shape if fmt is not None else None,  # None: planned once downloaded
                fmt=fmt,
                group_size=group or 64,
            )
        )

    def bind_store(self, store: QSettings) -> list[str]:
        """Restore the folders saved in `store` and save them there from now on.

        Folders that no longer exist (or no longer hold a model) are skipped and dropped;
        returns them, so the window can say so.
        """
        self._store = store
        try:
            saved = json.loads(str(store.value(FOLDERS_KEY, "[]") or "[]"))
        except ValueError:
            saved = []
        skipped = []
        for folder in saved if isinstance(saved, list) else []:
            try:
                check_model_folder(str(folder))
            except FolderRefused:
                skipped.append(str(folder))
                continue
            if str(folder) not in self._folders:
                self._folders.append(str(folder))
        self._save_folders()
        self._restore_repos(store)
        self.rescan()
        return skipped

    def _restore_repos(self, store: QSettings) -> None:
        try:
            saved = json.loads(str(store.value(REPOS_KEY, "[]") or "[]"))
        except ValueError:
            saved = []
        from app.workers.hub_probe import REPO_ID

        known = {e.repo for e in [*self._catalog, *self._repos]}
        for item in saved if isinstance(saved, list) else []:
            ok = isinstance(item, dict) and isinstance(item.get("config"), dict)
            ok = ok and isinstance(item.get("repo"), str) and isinstance(item.get("size"), int)
            if ok and REPO_ID.fullmatch(item["repo"]):  # an edited file's odd entry: skipped
                if item["repo"] not in known:
                    self._remember_repo(item["repo"], item["config"], item["size"])
                    known.add(item["repo"])

    def _save_repos(self) -> None:
        if self._store is not None:
            items = [
                {"repo": e.repo, "size": e.size_bytes, "config": self.shapes[f"hub:{e.repo}"]}
                for e in self._repos
            ]
            self._store.setValue(REPOS_KEY, json.dumps(items))
            self._store.sync()

    def _save_folders(self) -> None:
        store = self._store
        if store is not None:
            store.setValue(FOLDERS_KEY, json.dumps(self._folders))
            store.sync()

    def rescan(self) -> None:
        cached, self.scan_error = scan_cache(self.cache_dir)
        entries: list[Entry] = []
        for entry in [*self._catalog, *self._repos]:
            hit = cached.pop(entry.repo or "", None)
            if hit is not None and hit[3]:  # not loadable: Download finishes it
                entry = replace(entry, problem=hit[3])
            elif hit is not None:
                entry = replace(entry, local_dir=hit[0], revisions=hit[2])
            entries.append(entry)
        for repo, (snap, size, hashes, problem) in sorted(cached.items()):
            config = _config(snap)  # read once: the check and the title both need it
            if _qwen35_config(config):
                entries.append(
                    Entry(
                        key=f"cache:{repo}",
                        name=repo.split("/")[-1],
                        quant=_quant(config),
                        size_bytes=size,
                        source="cache",
                        repo=repo,
                        local_dir=None if problem else snap,
                        revisions=hashes,
                        problem=problem,
                    )
                )
        for folder in self._folders:
            entries.append(
                Entry(
                    key=f"folder:{folder}",
                    name=Path(folder).name,
                    quant=_quant(_config(folder)),
                    size_bytes=folder_size(folder),
                    source="folder",
                    local_dir=folder,
                )
            )
        self._entries = entries
        self.changed.emit()

    def delete(self, entry: Entry) -> str:
        """Remove a downloaded model from the HF cache (an interrupted download: all its
        files, parts included); returns an error sentence or ''."""
        if entry.problem and entry.repo:
            return self._delete_partial(entry)
        if entry.source == "hub" and not entry.downloaded:  # only taken off the list
            self._repos = [e for e in self._repos if e.repo != entry.repo]
            self._save_repos()
            self.rescan()
            return ""
        if entry.source == "folder":  # the user's own folder: only taken off the list
            self._folders = [f for f in self._folders if f != entry.local_dir]
            self._save_folders()
            self.rescan()
            return ""
        if not entry.revisions:
            return f"{entry.title} is not in the Hugging Face cache."
        try:
            from huggingface_hub import scan_cache_dir

            strategy = scan_cache_dir(self.cache_dir).delete_revisions(*entry.revisions)
            strategy.execute()
        except Exception as exc:
            return f"Could not delete {entry.title}: {type(exc).__name__}: {exc}"
        self.rescan()
        return ""

    def _delete_partial(self, entry: Entry) -> str:
        """An interrupted download's folder in the HF cache, snapshots, blobs and `.incomplete`
        parts alike (no revision of it is complete, so nothing loadable goes)."""
        from huggingface_hub import constants

        root = Path(self.cache_dir or constants.HF_HUB_CACHE)
        folder = root / ("models--" + str(entry.repo).replace("/", "--"))
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            pass  # removed by hand since the last scan
        except OSError as exc:
            return f"Could not delete the unfinished download of {entry.title} ({folder}): {exc}"
        self.rescan()
        return ""
