"""A restore from the disk tier on the CUDA state, without a GPU (the stand-ins of
test_cuda_state_snapshots.py): the saved file is read into the spare pinned buffer, lent
for the read, restores the slot bit for bit, and the spare is taken back; a file larger
than the spare is read into a buffer of its own."""

from __future__ import annotations

import numpy as np

from engine.snapshot_store import SnapshotStore, StoreKey
from tests.engine import test_cuda_state_snapshots as fake

state = fake.state  # the fixture: a StreamState over host arrays that copy as CuPy's do
KEY = StoreKey("m" * 64, "0", "cuda:bfloat16")


def test_a_saved_file_is_read_into_the_spare_and_restores_the_slot(state, tmp_path):
    n = 40
    ids = list(range(n))
    assert SnapshotStore(tmp_path, KEY, 1 << 30).save(ids, state.save_slot_to_host(0, n))
    state.keep_spare()
    spare = state._spare
    back = SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids), state.give_spare)
    assert state._spare is None  # lent whole for the read
    assert all(np.shares_memory(a, spare) for a in back.arrays.values())
    state.restore_slot(1, back)
    for a, b in zip(fake._slot(state, 1, n), fake._slot(state, 0, n), strict=True):
        assert np.array_equal(a, b)
    state.take_back_spare(spare)
    assert state._spare is spare
    state.keep_spare()  # nothing to pin: the spare is back
    assert state._spare is spare


def test_a_file_larger_than_the_spare_is_read_into_its_own_buffer(state, tmp_path):
    n = 40
    ids = list(range(n))
    assert SnapshotStore(tmp_path, KEY, 1 << 30).save(ids, state.save_slot_to_host(0, n))
    small = np.zeros(64, np.uint8)
    state._spare = small
    back = SnapshotStore(tmp_path, KEY, 1 << 30).load(tuple(ids), state.give_spare)
    assert back is not None and state._spare is small  # kept for a move down
    assert not any(np.shares_memory(a, small) for a in back.arrays.values())
