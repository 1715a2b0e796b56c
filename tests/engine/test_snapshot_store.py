"""The prompt cache's disk tier: exact round trips, and a refusal (never a wrong state) for
a corrupt, truncated or foreign file, or a full disk."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import xxhash

from engine import snapshot_file, snapshot_folder, snapshot_store
from engine.snapshot_store import HostSnapshot, SnapshotStore, StoreKey, entry_name

KEY = StoreKey(model="m" * 64, engine="0.1.0", precision="numpy:float32")


def listing(folder: Path) -> list[str]:
    """The folder's files, less the lock file the engines using it share."""
    return sorted(p.name for p in folder.iterdir() if p.name != snapshot_store.LOCK_NAME)


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
    assert sorted(Path(n).suffix for n in listing(tmp_path)) == [".json", ".safetensors"]
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
    assert listing(tmp_path) == []  # the orphaned data went at the next start


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
    assert len(raw) <= info["block_bytes"]  # one block
    info["xxh3_128"] = [xxhash.xxh3_128_hexdigest(bytes(raw))]
    meta.write_text(json.dumps(info))
    with caplog.at_level(logging.WARNING):
        assert SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids)) is None
    assert "refusing saved state" in caplog.text and not data.exists()
    assert "checksum" not in caplog.text  # the checksums held: the header refused it


# ----- blocks read in parallel, each checked as it is read ---------------------------------
@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 1 KiB read in chunks of 300 bytes: a snapshot spans several blocks, and a
    block several reads."""
    monkeypatch.setattr(snapshot_store, "BLOCK_BYTES", 1024)
    monkeypatch.setattr(snapshot_file, "READ_CHUNK", 300)
    return 1024


def _saved(folder, ids, seed: int = 0) -> tuple[SnapshotStore, HostSnapshot, Path]:
    store = SnapshotStore(folder, KEY, 1 << 30)
    snap = _snapshot(len(ids), seed)
    assert store.save(ids, snap)
    return store, snap, folder / f"{entry_name(KEY, ids)}.safetensors"


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_a_file_read_by_several_threads_gives_the_arrays_saved(
    tmp_path, monkeypatch, small_blocks, threads
):
    monkeypatch.setattr(snapshot_file, "READ_THREADS", threads)
    ids = list(range(30))
    _, snap, data = _saved(tmp_path, ids, seed=5)
    meta = json.loads(data.with_suffix(".json").read_text())
    blocks = -(-data.stat().st_size // small_blocks)
    assert meta["block_bytes"] == small_blocks and len(meta["xxh3_128"]) == blocks > 4
    back = SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids))
    assert back.arrays.keys() == snap.arrays.keys()
    for k, v in snap.arrays.items():
        assert back.arrays[k].dtype == v.dtype and np.array_equal(back.arrays[k], v)


def test_a_flipped_byte_in_any_block_is_refused(tmp_path, small_blocks, caplog):
    ids = list(range(30))
    _, _, data = _saved(tmp_path, ids)
    good = data.read_bytes()
    blocks = -(-len(good) // small_blocks)
    for block in range(blocks):
        folder = tmp_path / f"b{block}"
        store, _, data = _saved(folder, ids)
        raw = bytearray(good)
        raw[min(len(raw) - 1, block * small_blocks + 517)] ^= 0x01
        data.write_bytes(bytes(raw))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert store.load(tuple(ids)) is None
        assert f"its block {block} of {blocks} does not match its checksum" in caplog.text
        assert not data.exists()


@pytest.mark.parametrize("cut", [1, 1024, 1500])
def test_a_file_shorter_or_longer_than_its_checksums_is_refused(
    tmp_path, small_blocks, caplog, cut
):
    ids = list(range(30))
    store, _, data = _saved(tmp_path, ids)
    raw = data.read_bytes()
    data.write_bytes(raw[:-cut] if cut < 1500 else raw + bytes(cut))
    with caplog.at_level(logging.WARNING):
        assert store.load(tuple(ids)) is None
    assert "checksum" in caplog.text and "refusing saved state" in caplog.text


def test_an_entry_of_the_old_format_is_refused_with_its_reason(tmp_path, caplog):
    """A format-2 index (one checksum of the whole file) is not read as blocks: a new store
    logs why it does not restore it, and a load refuses it."""
    ids = list(range(40))
    store, _, data = _saved(tmp_path, ids)
    meta = data.with_suffix(".json")
    info = json.loads(meta.read_text())
    info["format"] = 2
    info["xxh3_128"] = xxhash.xxh3_128_hexdigest(data.read_bytes())
    del info["block_bytes"]
    meta.write_text(json.dumps(info))
    reopened = SnapshotStore(tmp_path, KEY, 1 << 30)
    assert len(reopened) == 0 and reopened.held_bytes > 0  # counted, not restored
    with caplog.at_level(logging.INFO):
        assert reopened.lookup(ids + [1]) is None
        assert reopened.load(tuple(ids)) is None
    assert f"format '2' (this is {snapshot_store.FORMAT})" in caplog.text
    assert "refusing saved state" in caplog.text


def test_a_restore_reads_into_the_buffer_it_is_given(tmp_path, small_blocks):
    ids = list(range(20))
    _, snap, data = _saved(tmp_path, ids, seed=6)
    size = data.stat().st_size
    asked: list[int] = []
    given = np.full(size + 4096, 0xAB, np.uint8)  # larger than the file: its head is used

    def buffer(nbytes: int) -> np.ndarray:
        asked.append(nbytes)
        return given

    back = SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids), buffer)
    assert asked == [size]
    assert np.array_equal(given[:size], np.frombuffer(data.read_bytes(), np.uint8))
    assert (given[size:] == 0xAB).all()
    for k, v in snap.arrays.items():
        assert np.shares_memory(back.arrays[k], given[:size]) and np.array_equal(back.arrays[k], v)
    own = SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids), lambda nbytes: None)
    assert not any(np.shares_memory(a, given) for a in own.arrays.values())  # its own buffer


def test_files_that_are_no_saved_state_are_never_touched(tmp_path):
    """A folder that holds other files (a model's, given as the cache folder by mistake):
    opening a store there, saving past its budget and clearing it remove only the saved
    states and what interrupted saves left."""
    foreign = {
        "config.json": "{}",
        "tokenizer_config.json": '{"x": 1}',
        "model.safetensors": "weights",
        "notes.tmp": "mine",
    }
    for name, text in foreign.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "tmpab12_x.safetensors.tmp").write_text("half a save")
    one = _snapshot(40).nbytes
    store = SnapshotStore(tmp_path, KEY, one + one // 2)
    assert not (tmp_path / "tmpab12_x.safetensors.tmp").exists()
    for start in (0, 1000, 2000):  # past the budget: the oldest states are evicted
        store.save(list(range(start, start + 40)), _snapshot(40))
    assert store.lookup(list(range(2000, 2041)))
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.name in foreign} == foreign
    count, _, _ = snapshot_folder.clear_folder(tmp_path)
    assert count == 1
    assert listing(tmp_path) == sorted(foreign)
