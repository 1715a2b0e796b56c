"""`snug cache` as users meet it: what it says it removed is what is gone from the folder."""

from __future__ import annotations

import errno
from pathlib import Path

from engine import snapshot_folder
from engine.cli import main
from engine.snapshot_store import SnapshotStore
from tests.engine.test_snapshot_store import KEY, _snapshot, listing


def _saved(folder: Path, count: int) -> None:
    store = SnapshotStore(folder, KEY, 1 << 30)
    for n in range(count):
        assert store.save(list(range(100 * n, 100 * n + 40)), _snapshot(40, seed=n))


def test_clear_on_a_read_only_folder_says_nothing_was_removed(tmp_path, monkeypatch, capsys):
    _saved(tmp_path, 3)
    before = listing(tmp_path)

    def read_only(self, missing_ok=False):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 2
    got = capsys.readouterr()
    assert f"removed 0 saved prompt states (0.0 MiB) from {tmp_path}" in got.out
    assert f"3 saved prompt states in {tmp_path} could not be removed" in got.err
    assert "run `snug cache clear` again" in got.err
    assert listing(tmp_path) == before  # every state is still there, as it said
    monkeypatch.undo()
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert "removed 3 saved prompt states" in capsys.readouterr().out
    assert listing(tmp_path) == []


def test_clear_counts_only_the_entries_it_removed(tmp_path, monkeypatch):
    _saved(tmp_path, 3)
    stuck = sorted(tmp_path.glob("*.json"))[0]
    real = Path.unlink

    def held_open(self, missing_ok=False):  # one file another program holds (Windows)
        if self == stuck:
            raise PermissionError(errno.EACCES, "The file is in use", str(self))
        real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", held_open)
    done = snapshot_folder.clear_folder(tmp_path)
    assert (done.count, done.kept) == (2, 1)
    left = sum(p.stat().st_size for p in tmp_path.glob(f"{stuck.stem}.*"))
    assert done.nbytes > 0 and listing(tmp_path) == sorted(
        p.name for p in tmp_path.glob(f"{stuck.stem}.*")
    )
    assert left > 0  # the kept entry whole, its data beside its index


def test_a_folder_that_cannot_be_read_is_named_not_shown_empty(tmp_path, monkeypatch, capsys):
    """A folder another user owns (`sudo snug serve` made it): listing it is refused, which
    a glob takes for an empty folder; info and clear say so, and change nothing."""
    import os

    _saved(tmp_path, 2)
    before = listing(tmp_path)
    real = os.scandir

    def denied(path="."):
        if Path(path) == tmp_path:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", denied)
    for command in ("info", "clear"):
        assert main(["cache", command, "--dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path} cannot be read (Permission denied)" in err, err
        assert "check --dir" in err
    monkeypatch.undo()
    assert listing(tmp_path) == before
