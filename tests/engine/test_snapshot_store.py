"""The prompt cache's disk tier: exact round trips, and a refusal (never a wrong state) for
a corrupt, truncated or foreign file, or a full disk."""

from __future__ import annotations

import errno
import logging

import numpy as np
import pytest

from engine.snapshot_store import HostSnapshot, SnapshotStore, StoreKey, entry_name

KEY = StoreKey(model="m" * 64, engine="0.1.0", precision="numpy:float32")


def _snapshot(length: int, seed: int = 0) -> HostSnapshot:
    rng = np.random.default_rng(seed)
    return HostSnapshot(
        length,
        {
            "kv_k.0": rng.standard_normal((2, length, 8), dtype=np.float32),
            "kv_v.0": rng.standard_normal((2, length, 8), dtype=np.float32),
            "conv.0": rng.integers(0, 1 << 16, (3, 16), dtype=np.uint16),  # bf16 bits
            "recurrent.0": rng.standard_normal((4, 8, 8), dtype=np.float32),
        },
    )


def test_a_saved_state_comes_back_bit_for_bit_in_a_new_store(tmp_path):
    ids = list(range(100, 140))
    snap = _snapshot(40)
    assert SnapshotStore(tmp_path, KEY, 1 << 30).save(ids, snap)
    reopened = SnapshotStore(tmp_path, KEY, 1 << 30)  # as after a restart
    assert reopened.lookup(ids + [7, 8]) == tuple(ids)
    assert reopened.lookup(ids) is None  # a prompt must extend the saved ids
    back = reopened.load(tuple(ids))
    assert back.length == 40 and back.arrays.keys() == snap.arrays.keys()
    for k, v in snap.arrays.items():
        assert back.arrays[k].dtype == v.dtype and np.array_equal(back.arrays[k], v)


@pytest.mark.parametrize("damage", ["corrupt", "truncate", "delete"])
def test_a_damaged_file_is_refused_and_removed(tmp_path, caplog, damage):
    ids = list(range(50))
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    store.save(ids, _snapshot(50))
    data = tmp_path / f"{entry_name(KEY, ids)}.safetensors"
    raw = bytearray(data.read_bytes())
    if damage == "corrupt":
        raw[-5] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(bytes(raw[: len(raw) // 2]))
    else:
        data.unlink()
    with caplog.at_level(logging.WARNING):
        assert store.load(tuple(ids)) is None
    assert "refusing saved state" in caplog.text
    assert store.lookup(ids + [1]) is None and not data.exists()


@pytest.mark.parametrize(
    "other",
    [
        StoreKey("x" * 64, KEY.engine, KEY.precision),
        StoreKey(KEY.model, "0.2.0", KEY.precision),
        StoreKey(KEY.model, KEY.engine, "cuda:bfloat16"),
    ],
)
def test_another_model_engine_or_precision_sees_nothing(tmp_path, other):
    ids = list(range(30))
    SnapshotStore(tmp_path, KEY, 1 << 30).save(ids, _snapshot(30))
    assert SnapshotStore(tmp_path, other, 1 << 30).lookup(ids + [1]) is None


def test_a_full_disk_keeps_the_old_cache(tmp_path, monkeypatch, caplog):
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    old = list(range(20))
    store.save(old, _snapshot(20))
    import safetensors.numpy

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    with caplog.at_level(logging.WARNING):
        assert not store.save(list(range(30)), _snapshot(30, seed=1))
    assert "could not save" in caplog.text
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".safetensors"]
    assert np.array_equal(store.load(tuple(old)).arrays["kv_k.0"], _snapshot(20).arrays["kv_k.0"])


def test_a_crash_before_the_index_is_written_leaves_no_entry(tmp_path, monkeypatch):
    """The data is renamed into place first and the JSON last: an interrupted save leaves
    either the old entry or none, never an index pointing at the wrong data."""
    import os

    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    real = os.replace
    calls = []

    def crash_on_index(src, dst):
        calls.append(dst)
        if str(dst).endswith(".json"):
            raise OSError(errno.EIO, "power lost")
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_index)
    assert not store.save(list(range(10)), _snapshot(10))
    monkeypatch.setattr(os, "replace", real)
    assert SnapshotStore(tmp_path, KEY, 1 << 30).lookup(list(range(11))) is None
    assert list(tmp_path.iterdir()) == []  # the orphaned data went at the next start


def test_least_recently_used_go_first_past_the_budget(tmp_path):
    one = _snapshot(40).nbytes
    store = SnapshotStore(tmp_path, KEY, 2 * one + one // 2)
    a, b, c = (list(range(i, i + 40)) for i in (0, 1000, 2000))
    store.save(a, _snapshot(40))
    store.save(b, _snapshot(40))
    store.load(tuple(a))  # a is used again: b is now the oldest
    store.save(c, _snapshot(40))
    assert store.lookup(a + [1]) and store.lookup(c + [1]) and store.lookup(b + [1]) is None
    assert store.held_bytes <= store.budget_bytes


def test_a_restore_reads_the_file_once_into_views_of_one_buffer(tmp_path):
    ids = list(range(10))
    assert SnapshotStore(tmp_path, KEY, 1 << 30).save(ids, _snapshot(10, seed=3))
    back = SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids))

    def root(a: np.ndarray) -> np.ndarray:
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    roots = {id(root(a)): root(a) for a in back.arrays.values()}
    assert len(roots) == 1  # no array copied out of the one buffer the file was read into
    (buffer,) = roots.values()
    assert buffer.nbytes == (tmp_path / f"{entry_name(KEY, ids)}.safetensors").stat().st_size


def test_a_header_that_lies_is_refused_even_with_a_matching_checksum(tmp_path, caplog):
    """A file rewritten with its offsets shifted and its checksum updated (not damage but a
    wrong writer): the header's rules refuse it, nothing is restored."""
    import json

    import xxhash

    ids = list(range(20))
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    assert store.save(ids, _snapshot(20, seed=4))
    name = entry_name(KEY, ids)
    data, meta = tmp_path / f"{name}.safetensors", tmp_path / f"{name}.json"
    raw = bytearray(data.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    first = min(header, key=lambda k: header[k]["data_offsets"][0] if k != "__metadata__" else 0)
    header[first]["data_offsets"][1] -= 4  # overlaps nothing, leaves a gap: not a safetensors file
    text = json.dumps(header).encode().ljust(n)
    raw[8 : 8 + n] = text[:n] if len(text) >= n else text
    data.write_bytes(bytes(raw))
    info = json.loads(meta.read_text())
    info["xxh3_128"] = xxhash.xxh3_128_hexdigest(bytes(raw))
    meta.write_text(json.dumps(info))
    with caplog.at_level(logging.WARNING):
        assert SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids)) is None
    assert "refusing saved state" in caplog.text and not data.exists()
