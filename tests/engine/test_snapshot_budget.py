"""The disk tier's budget is the folder's bytes: every file of every entry (the state's
arrays, its safetensors header and its JSON index with the conversation's ids), whoever
saved it and whatever its index says of itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from engine.snapshot_store import SnapshotStore
from tests.engine.test_snapshot_store import KEY, _snapshot


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".json", ".safetensors"))


def _long_ids(seed: int, n: int = 2000) -> list[int]:
    return np.random.default_rng(seed).integers(100_000, 248_000, n).tolist()


def test_the_files_of_many_saves_stay_within_the_budget(tmp_path):
    store = SnapshotStore(tmp_path, KEY, 3 * _snapshot(2000).nbytes)
    for seed in range(8):
        assert store.save(_long_ids(seed), _snapshot(2000, seed=seed))
        assert _folder_bytes(tmp_path) <= store.budget_bytes
    again = SnapshotStore(tmp_path, KEY, store.budget_bytes)  # a restart counts the same
    assert again.held_bytes == _folder_bytes(tmp_path) and len(again) >= 2


def test_an_index_that_understates_its_size_still_counts_its_files(tmp_path):
    store = SnapshotStore(tmp_path, KEY, 3 * _snapshot(40).nbytes)
    store.save(list(range(40)), _snapshot(40))
    meta_path = next(tmp_path.glob("*.json"))
    meta = json.loads(meta_path.read_text())
    meta["nbytes"] = -(10**12)  # edited by hand, or written by a broken copy
    meta_path.write_text(json.dumps(meta))
    store = SnapshotStore(tmp_path, KEY, store.budget_bytes)
    for start in range(100, 1100, 100):
        store.save(list(range(start, start + 40)), _snapshot(40))
        assert _folder_bytes(tmp_path) <= store.budget_bytes
