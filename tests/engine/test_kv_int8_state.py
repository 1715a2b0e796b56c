"""The CUDA state with the 8-bit KV cache, without a GPU (device arrays stood in by host
arrays, as in test_cuda_state_snapshots.py): int8 codes and fp32 scales in the stream block,
and every snapshot path carrying the scales with the codes, bit for bit."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

import engine.backends.cuda.state as state_module
from engine.backends.cuda.state import StreamState
from engine.checkpoint import Checkpoint
from engine.snapshot_store import SnapshotMismatch, SnapshotStore, StoreKey
from tests.engine.test_cuda_state_snapshots import _Pool

PARTS = ("kv_k", "kv_v", "conv", "recurrent", "kv_k_scale", "kv_v_scale")


def _state(config, int8: bool) -> StreamState:
    kernels = SimpleNamespace(act_dtype=np.uint16, act_itemsize=2, dtype="bfloat16")
    st = StreamState(kernels, _Pool(), SimpleNamespace(synchronize=lambda: None))
    st.kv_int8 = int8
    st.alloc(config, slots=2, context=64)
    rng = np.random.default_rng(1)
    for arr in st._arrays():
        if arr.dtype == np.float32:
            arr[...] = rng.standard_normal(arr.shape, dtype=np.float32)
        else:
            info = np.iinfo(arr.dtype)
            arr[...] = rng.integers(info.min, info.max, arr.shape, dtype=arr.dtype, endpoint=True)
    return st


@pytest.fixture
def config(tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(state_module, "on_stream", lambda _s: contextlib.nullcontext())
    monkeypatch.setattr(StreamState, "_pinned", staticmethod(lambda n: np.zeros(n, np.uint8)))
    return Checkpoint.open(tiny_checkpoint("untied-l8-r2", "hf-fp32")).config


def _slot(st: StreamState, slot: int, n: int) -> dict[str, np.ndarray]:
    out = {}
    for part in st.parts:
        arr = getattr(st, part)[:, slot]
        out[part] = np.array(arr[:, :, :n] if part.startswith("kv_") else arr)
    return out


def test_the_block_holds_codes_and_scales(config):
    st = _state(config, int8=True)
    L, H = len(config.full_layers), config.num_key_value_heads
    assert st.parts == PARTS and st.kv_k.dtype == np.int8 and st.kv_v.dtype == np.int8
    assert st.kv_k_scale.shape == (L, 2, H, 64) and st.kv_v_scale.dtype == np.float32
    bf16 = _state(config, int8=False)
    assert bf16.kv_k.dtype == np.uint16 and bf16.kv_k_scale is None
    assert st.block.nbytes < bf16.block.nbytes
    for n in (1, 23, 64):
        snapshot = st.save_slot(0, n)
        assert st.snapshot_bytes(n) == st.snapshot_nbytes(snapshot)
        assert set(PARTS) <= set(snapshot)
    st.reset_slot(1)
    assert not any(v.any() for v in _slot(st, 1, 64).values())


def test_every_snapshot_path_restores_the_slot_bit_for_bit(config, tmp_path):
    st = _state(config, int8=True)
    n = 37
    want = _slot(st, 0, n)
    block = st.save_slot(0, n)
    host = st.snapshot_to_host(block)
    assert host.arrays["kv_k.0"].dtype == np.int8
    assert host.arrays["kv_v_scale.1"].shape == (config.num_key_value_heads, n)
    store = SnapshotStore(tmp_path, StoreKey("m" * 64, "0", "cuda:bfloat16:kv-int8"), 1 << 30)
    assert store.save(list(range(n)), host)
    from_disk = SnapshotStore(tmp_path, store.key, 1 << 30).load(tuple(range(n)))
    st.snapshots_on_host = True
    pinned = st.save_slot(0, n)
    assert "pinned" in pinned and st.snapshot_nbytes(pinned) == pinned["nbytes"]
    for snapshot in (block, host, from_disk, pinned):
        st.restore_slot(1, snapshot)
        got = _slot(st, 1, n)
        for part in PARTS:
            assert np.array_equal(got[part], want[part]), part
        assert not st.kv_k_scale[:, 1, :, n:].any() and not st.kv_k[:, 1, :, n:].any()


def test_a_bf16_state_is_not_restored_into_the_8_bit_cache(config):
    bf16, int8 = _state(config, int8=False), _state(config, int8=True)
    with pytest.raises(SnapshotMismatch):
        int8.restore_slot(1, bf16.save_slot_to_host(0, 10))
    with pytest.raises(SnapshotMismatch):
        bf16.restore_slot(1, int8.save_slot_to_host(0, 10))
