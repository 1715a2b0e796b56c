"""The CUDA state's host snapshots, without a GPU: device arrays stood in by host arrays
whose `.data` copies with memmove, so the byte layout of `snapshot_to_host`, the pinned
path and `restore_slot(HostSnapshot)` is checked here (tests/device runs the real copies).
bf16 state stays uint16 bits, bit for bit, through the disk and back into another slot."""

from __future__ import annotations

import contextlib
import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

import engine.backends.cuda.state as state_module
from engine.backends.cuda.state import StreamState
from engine.checkpoint import Checkpoint
from engine.snapshot_store import HostSnapshot, SnapshotMismatch, SnapshotStore, StoreKey


class _Pointer:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def copy_to_host_async(self, dst: int, nbytes: int, stream: object) -> None:
        assert self.array.flags.c_contiguous
        ctypes.memmove(dst, self.array.ctypes.data, nbytes)

    def copy_from_host_async(self, src: int, nbytes: int, stream: object) -> None:
        assert self.array.flags.c_contiguous
        ctypes.memmove(self.array.ctypes.data, src, nbytes)


class DeviceArray(np.ndarray):
    """A host array that answers `.data` as a CuPy array does (a pointer that copies)."""

    @property
    def data(self) -> _Pointer:  # type: ignore[override]
        return _Pointer(self)


class _Block:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.bytes = np.zeros(nbytes, np.uint8).view(DeviceArray)
        self.freed = False

    def view(self, offset: int, shape: tuple[int, ...], dtype: str) -> DeviceArray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.bytes[offset : offset + n].view(dtype).reshape(shape)

    def free(self) -> None:
        self.freed = True


class _Pool:
    def alloc(self, nbytes: int, tag: str) -> _Block:
        return _Block(nbytes)


@pytest.fixture
def state(tiny_checkpoint, monkeypatch) -> StreamState:
    monkeypatch.setattr(state_module, "on_stream", lambda _s: contextlib.nullcontext())
    monkeypatch.setattr(StreamState, "_pinned", staticmethod(lambda n: np.zeros(n, np.uint8)))
    config = Checkpoint.open(tiny_checkpoint("untied-l8-r2", "hf-fp32")).config
    kernels = SimpleNamespace(act_dtype=np.uint16, act_itemsize=2, dtype="bfloat16")
    st = StreamState(kernels, _Pool(), SimpleNamespace(synchronize=lambda: None))
    st.alloc(config, slots=2, context=64)
    rng = np.random.default_rng(0)
    for arr in (st.kv_k, st.kv_v, st.conv):
        arr[...] = rng.integers(0, 1 << 16, arr.shape, dtype=np.uint16)
    st.recurrent[...] = rng.standard_normal(st.recurrent.shape, dtype=np.float32)
    return st


def _slot(st: StreamState, slot: int, n: int) -> list[np.ndarray]:
    return [
        np.array(st.kv_k[:, slot, :, :n]),
        np.array(st.kv_v[:, slot, :, :n]),
        np.array(st.conv[:, slot]),
        np.array(st.recurrent[:, slot]),
    ]


def test_host_snapshots_hold_the_slot_exactly(state):
    n = 23
    block = state.snapshot_to_host(state.save_slot(0, n))
    pinned = state.save_slot_to_host(0, n)
    kv_k, kv_v, conv, rec = _slot(state, 0, n)
    for host in (block, pinned):
        assert host.length == n and host.arrays.keys() == pinned.arrays.keys()
        for i in range(kv_k.shape[0]):
            assert host.arrays[f"kv_k.{i}"].dtype == np.uint16  # bf16 bits, not widened
            assert np.array_equal(host.arrays[f"kv_k.{i}"], kv_k[i])
            assert np.array_equal(host.arrays[f"kv_v.{i}"], kv_v[i])
        for i in range(conv.shape[0]):
            assert np.array_equal(host.arrays[f"conv.{i}"], conv[i])
            assert host.arrays[f"recurrent.{i}"].dtype == np.float32
            assert np.array_equal(host.arrays[f"recurrent.{i}"], rec[i])


def test_a_host_snapshot_from_disk_restores_the_slot_bit_for_bit(state, tmp_path):
    n = 40
    host = state.snapshot_to_host(state.save_slot(0, n))
    store = SnapshotStore(tmp_path, StoreKey("m" * 64, "0", "cuda:bfloat16"), 1 << 30)
    ids = list(range(n))
    assert store.save(ids, host)
    back = SnapshotStore(tmp_path, store.key, 1 << 30).load(tuple(ids))
    state.restore_slot(1, back)
    for a, b in zip(_slot(state, 1, n), _slot(state, 0, n), strict=True):
        assert np.array_equal(a, b)
    assert not state.kv_k[:, 1, :, n:].any()  # past the length: reset, not stale


def test_a_host_snapshot_of_another_layout_is_refused(state):
    host = state.save_slot_to_host(0, 10)
    widened = {k: v.astype(np.float32) for k, v in host.arrays.items()}
    with pytest.raises(SnapshotMismatch, match="kv_k|conv"):
        state.restore_slot(1, HostSnapshot(10, widened))
    with pytest.raises(SnapshotMismatch):
        state.restore_slot(1, HostSnapshot(65, host.arrays))  # past the context


def test_a_pinned_snapshot_restores_the_slot_bit_for_bit(state):
    """Where the plan keeps saved states in host memory, `save_slot` returns a pinned
    snapshot; `restore_slot` takes it back through its host views."""
    n = 31
    state.snapshots_on_host = True
    snapshot = state.save_slot(0, n)
    assert "pinned" in snapshot and state.snapshot_nbytes(snapshot) == snapshot["nbytes"]
    state.restore_slot(1, snapshot)
    for a, b in zip(_slot(state, 1, n), _slot(state, 0, n), strict=True):
        assert np.array_equal(a, b)
    assert not state.kv_k[:, 1, :, n:].any()


def test_a_move_inside_a_reply_takes_the_spare_and_waits_only_when_read(state, monkeypatch):
    """`snapshot_to_host(wait=False)` queues the copy into the spare pinned buffer (no
    allocation, no wait); `settle` waits once; a small state pins its own buffer."""
    pinned: list[int] = []

    def pin(n: int) -> np.ndarray:
        pinned.append(n)
        return np.zeros(n, np.uint8)

    monkeypatch.setattr(StreamState, "_pinned", staticmethod(pin))
    waits: list[int] = []
    state.stream = SimpleNamespace(synchronize=lambda: waits.append(1))
    state.keep_spare()
    state.keep_spare()  # held already: nothing pinned
    assert pinned == [state.snapshot_bytes(state.context)]
    n = state.context - 4
    host = state.snapshot_to_host(state.save_slot(0, n), wait=False)
    assert len(pinned) == 1 and not waits
    state.settle()
    state.settle()
    assert waits == [1]
    kv_k, _, _, rec = _slot(state, 0, n)
    assert np.array_equal(host.arrays["kv_k.0"], kv_k[0])
    assert np.array_equal(host.arrays["recurrent.0"], rec[0])
    state.keep_spare()
    assert len(pinned) == 2  # the spare was taken: a new one
    state._spare = np.zeros(4 * state.snapshot_bytes(state.context), np.uint8)
    state.snapshot_to_host(state.save_slot(0, n), wait=False)
    assert len(pinned) == 3 and state._spare is not None  # under half the spare: its own


def test_moves_inside_a_reply_take_the_buffers_readied_for_them(state, monkeypatch):
    """`keep_ready` pins, at a request's end, a buffer of each device snapshot's host size
    (those the prompt cache would move next); a move inside the next reply copies into its
    own with no allocation; buffers of sizes no longer wanted go before new ones are pinned."""
    pinned: list[int] = []

    def pin(n: int) -> np.ndarray:
        pinned.append(n)
        return np.zeros(n, np.uint8)

    monkeypatch.setattr(StreamState, "_pinned", staticmethod(pin))
    state.stream = SimpleNamespace(synchronize=lambda: None)
    short, longer = state.save_slot(0, 5), state.save_slot(0, 20)
    sizes = [state.host_nbytes(short), state.host_nbytes(longer)]
    assert sizes[0] < sizes[1] and state._spare is None  # no spare held: only these
    state.keep_ready([longer, short])
    assert pinned == sizes[::-1]
    state.keep_ready([short, longer])  # the same sizes: held already
    assert len(pinned) == 2
    ready = list(state._ready)
    host = state.snapshot_to_host(short, wait=False)
    assert len(pinned) == 2 and host.arrays["kv_k.0"].base is not None
    assert np.shares_memory(host.arrays["recurrent.0"], ready[0])
    kv_k, _, _, rec = _slot(state, 0, 5)
    assert np.array_equal(host.arrays["kv_k.0"], kv_k[0])
    assert np.array_equal(host.arrays["recurrent.0"], rec[0])
    state.snapshot_to_host(short, wait=False)  # its buffer was taken: one of its own
    assert len(pinned) == 3
    state.snapshot_to_host(longer)  # a move at a request's end takes its buffer too
    assert len(pinned) == 3 and state._ready == []
    state.keep_ready([longer])
    assert len(pinned) == 4
    state.keep_ready([longer])  # the one held fits: kept, nothing pinned
    assert len(pinned) == 4 and [b.nbytes for b in state._ready] == [sizes[1]]
    state.keep_ready([short])
    assert pinned[-1] == sizes[0] and [b.nbytes for b in state._ready] == [sizes[0]]
    state.snapshots_on_host = True
    state.keep_ready([state.save_slot(0, 7)])  # a pinned snapshot moves without a copy
    assert state._ready == []
