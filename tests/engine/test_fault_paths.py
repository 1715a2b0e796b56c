"""The fault paths on the CPU (tests/device/test_faults.py runs them on the real pool and
the GPU): `fail_next` on both pools and what their errors say, what counts as out of
memory, a graph capture without memory, a load or an upload that fails part way, and a
refused decode step in the scheduler (docs/reliability.md)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engine.config import GIB, EngineSettings
from engine.errors import (
    CheckpointError,
    DeviceOutOfMemory,
    GraphCaptureFailed,
    RequestRefused,
)
from engine.memory.growth import GrowableBuffer
from engine.memory.pool import CupyPool, SimulatedPool, is_out_of_memory
from engine.scheduler import Scheduler
from engine.session import Engine, GenerationParams

NUMPY = EngineSettings(backend="numpy")
GREEDY = GenerationParams(max_new_tokens=10, greedy=True)


def test_fail_next_fails_that_kind_of_allocation_then_disarms():
    pool = SimulatedPool(GIB)
    pool.fail_next("stream", 2)
    pool.alloc(100, "weights")
    for _ in range(2):
        with pytest.raises(DeviceOutOfMemory) as info:
            pool.alloc(10, "stream:0")
        assert info.value.category == "stream" and info.value.nbytes == 10
        assert "fail_next('stream')" in str(info.value)
    assert pool.pending_faults() == {}
    pool.alloc(10, "stream:0")
    assert pool.held_by_tag() == {"weights": 100, "stream:0": 10}
    assert [e[0] for e in pool.events] == ["alloc", "fail", "fail", "alloc"]
    pool.fail_next("prompt_cache:1")  # a whole tag arms that tag only
    pool.alloc(5, "prompt_cache:0")
    with pytest.raises(DeviceOutOfMemory):
        pool.alloc(5, "prompt_cache:1")
    pool.fail_next("scratch", 3)
    pool.fail_next("scratch", 0)  # disarmed
    pool.alloc(1, "scratch")
    assert pool.pending_faults() == {} and pool.held_bytes == 116
    with pytest.raises(ValueError):
        pool.fail_next("scratch", -1)


@pytest.mark.parametrize(
    "tag, words",
    [
        ("weights", ("the model's weights", "4-bit checkpoint", "SNUG_MEMORY_LIMIT_GIB")),
        ("stream", ("KV cache and DeltaNet state", "number of streams", "SNUG_MEMORY_LIMIT_GIB")),
        ("prompt_cache:2", ("a saved prompt state", "prefills its history")),
        ("other", ("'other'", "max rows", "SNUG_MEMORY_LIMIT_GIB")),
    ],
)
def test_an_allocation_failure_names_what_and_the_setting(tag, words):
    pool = SimulatedPool(GIB, limit=1000)
    pool.alloc(900, "weights")
    with pytest.raises(DeviceOutOfMemory) as info:
        pool.alloc(200, tag)  # past the limit, as a real out-of-memory
    message = str(info.value)
    assert "200 bytes" in message and "the memory limit is 1,000 bytes" in message
    assert all(w in message for w in words), message
    assert pool.held_bytes == 900


def test_the_real_pool_fails_an_armed_allocation_before_asking_the_device():
    pool = CupyPool()
    pool.fail_next("weights")
    with pytest.raises(DeviceOutOfMemory) as info:
        pool.alloc(1 << 30, "weights")  # no GPU is reached: the injected failure comes first
    assert info.value.category == "weights" and pool.held_bytes == 0
    assert pool.pending_faults() == {}


class _Rows(GrowableBuffer):
    tag = "rows"

    def size_for(self, rows: int) -> int:
        return rows * 100


def test_a_grow_failed_by_fail_next_keeps_the_old_block():
    pool = SimulatedPool(GIB)
    buf = _Rows(pool, 256)
    buf.ensure(16)
    block = buf.block
    pool.fail_next("rows")
    with pytest.raises(RequestRefused, match="could not grow to 64 rows.*16-row rows"):
        buf.ensure(40)
    assert buf.block is block and buf.capacity_rows == 16 and pool.held_bytes == 1600
    assert buf.ensure(40) and buf.capacity_rows == 64 and pool.held_bytes == 6400


def test_what_counts_as_out_of_memory():
    import cupy

    assert is_out_of_memory(cupy.cuda.memory.OutOfMemoryError(64, 0))
    assert is_out_of_memory(cupy.cuda.runtime.CUDARuntimeError(2))  # cudaErrorMemoryAllocation
    assert not is_out_of_memory(cupy.cuda.runtime.CUDARuntimeError(700))  # an illegal address
    assert not is_out_of_memory(MemoryError()) and not is_out_of_memory(ValueError())


def test_a_capture_without_memory_is_refused_by_name_and_stores_nothing(monkeypatch):
    """`DecodeGraphs.capture` around its captures: an out-of-memory (CuPy's, or CUDA's at
    instantiation) becomes GraphCaptureFailed and leaves the graphs as they were, the short
    graph made before the main one included; any other error passes unchanged."""
    import cupy

    from engine.backends.cuda.graphs import DecodeGraphs, _Captured

    graphs = DecodeGraphs(SimpleNamespace(graphs=None), model=None)
    graphs.warmed = {1, 2, 3}
    outcomes: list[BaseException | None] = []  # None: that capture succeeds
    made = []

    def capture(B, splits):
        if outcomes and (outcome := outcomes.pop(0)) is not None:
            raise outcome
        made.append((B, splits))
        return _Captured(graph=object(), logits=None, tokens=None)

    monkeypatch.setattr(graphs, "_capture", capture)
    monkeypatch.setattr(graphs, "short_limit", lambda: 0)
    graphs.capture(1)
    one = graphs.graphs[1]
    for error in (cupy.cuda.runtime.CUDARuntimeError(2), cupy.cuda.memory.OutOfMemoryError(8, 0)):
        outcomes.append(error)
        with pytest.raises(GraphCaptureFailed, match=r"2 streams.*SNUG_MEMORY_RESERVE_GIB"):
            graphs.capture(2)
        assert graphs.graphs == {1: one}
    outcomes.append(cupy.cuda.runtime.CUDARuntimeError(700))
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        graphs.capture(2)
    monkeypatch.setattr(graphs, "short_limit", lambda: 1024)  # a short graph, then the main
    outcomes.extend([None, cupy.cuda.runtime.CUDARuntimeError(2)])
    with pytest.raises(GraphCaptureFailed, match=r"3 streams"):
        graphs.capture(3)
    assert graphs.graphs == {1: one} and graphs.graphs[1].short is None
    graphs.capture(2)  # the next try captures
    assert set(graphs.graphs) == {1, 2} and graphs.graphs[2].short is not None


def test_a_load_that_fails_after_allocating_releases_it(tiny_checkpoint, monkeypatch):
    """Engine.load releases what the backend allocated before it raises, and a release that
    fails in turn does not hide the error that ended the load."""
    from engine.backends.numpy_backend import NumpyBackend

    path = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    released = []

    def no_room(self, config, slots, context):
        raise DeviceOutOfMemory("no room for the stream state in this test")

    monkeypatch.setattr(NumpyBackend, "alloc_state", no_room)
    monkeypatch.setattr(NumpyBackend, "release", lambda self: released.append(self))
    with pytest.raises(DeviceOutOfMemory, match="in this test"):
        Engine.load(path, NUMPY, context=256)
    assert len(released) == 1

    def broken(self):
        raise RuntimeError("release failed")

    monkeypatch.setattr(NumpyBackend, "release", broken)
    with pytest.raises(DeviceOutOfMemory, match="in this test"):
        Engine.load(path, NUMPY, context=256)


def test_a_saved_state_pins_a_buffer_of_its_own_and_names_a_failure(monkeypatch):
    """Pinned snapshots do not come from CuPy's pinned pool (which keeps every freed block
    for a later one of the same size, so the host's locked memory would only grow); no
    memory to pin is DeviceOutOfMemory naming the host budget's setting."""
    import cupy

    from engine.backends.cuda.state import StreamState

    made = []

    class Pinned:  # what cudaHostAlloc returns, as host bytes
        def __init__(self, size, flags=0):
            made.append(size)
            self.data = bytearray(size)

    def pooled(size):
        raise AssertionError("a saved state from CuPy's pinned pool")

    monkeypatch.setattr(cupy.cuda, "PinnedMemory", Pinned)
    monkeypatch.setattr(cupy.cuda, "PinnedMemoryPointer", lambda mem, offset: mem.data)
    monkeypatch.setattr(cupy.cuda, "alloc_pinned_memory", pooled)
    flat = StreamState._pinned(100)
    assert flat.nbytes == 100 and flat.dtype == np.uint8 and made == [100]

    def no_memory_to_pin(size, flags=0):
        raise cupy.cuda.runtime.CUDARuntimeError(2)

    monkeypatch.setattr(cupy.cuda, "PinnedMemory", no_memory_to_pin)
    with pytest.raises(DeviceOutOfMemory, match="100 bytes.*SNUG_PROMPT_CACHE_HOST_GIB"):
        StreamState._pinned(100)


class _HostBlocks(SimulatedPool):
    """A simulated pool whose blocks are host bytes, so `upload` can carve and fill them."""

    def alloc(self, nbytes, tag):
        block = super().alloc(nbytes, tag)
        data = np.zeros(nbytes, np.uint8)

        def view(offset, shape, dtype):
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            return data[offset : offset + n].view(dtype).reshape(shape)

        block.view = view
        return block


def test_an_upload_that_fails_part_way_gives_the_arena_back(tmp_path, monkeypatch):
    from engine.backends.cuda.weights import upload
    from engine.checkpoint import Checkpoint
    from engine.testing.synth import write_checkpoint

    checkpoint = Checkpoint.open(write_checkpoint(tmp_path / "tiny", "tiny", "mlx4", seed=2))

    def unreadable(*args, **kwargs):
        raise CheckpointError("a truncated tensor in this test")

    monkeypatch.setattr(checkpoint, "read", unreadable)
    monkeypatch.setattr(checkpoint, "read_raw", unreadable)
    pool = _HostBlocks(GIB)
    norms = SimpleNamespace(k=SimpleNamespace(act_dtype=np.float32, act_itemsize=4))
    with pytest.raises(CheckpointError, match="truncated"):
        upload(checkpoint, norms, SimpleNamespace(), pool)
    assert pool.held_bytes == 0
    assert [e[:2] for e in pool.events] == [("alloc", "weights"), ("free", "weights")]


def test_a_refused_decode_step_ends_its_requests_and_spares_the_others(
    tiny_checkpoint, monkeypatch
):
    """The scheduler's side of a capture that fails: the requests of that step get the error,
    a request still prefilling finishes with its solo tokens, and later ones are served."""
    engine = Engine.load(
        tiny_checkpoint("untied-l8-r2", "hf-fp32"), NUMPY, context=512, streams=3, max_rows=64
    )
    rng = np.random.default_rng(4)
    a, b, c = (rng.integers(0, 400, size=n).tolist() for n in (12, 6, 150))
    want = []
    for ids in (a, b, c):
        engine.prompt_cache.clear()
        want.append([e.token_id for e in engine.generate(ids, GREEDY)])
    engine.prompt_cache.clear()
    real, left = engine.backend.decode_step, [1]

    def decode_step(model, batch, ids):
        if batch.rows == 2 and left[0]:
            left[0] -= 1
            raise GraphCaptureFailed("the decode step of 2 streams could not be captured")
        return real(model, batch, ids)

    monkeypatch.setattr(engine.backend, "decode_step", decode_step)
    scheduler = Scheduler(engine, prefill_chunk=32)
    first = scheduler.submit(a, GREEDY)
    while len(first.generated) < 3:
        scheduler.run_once()
    second, third = scheduler.submit(b, GREEDY), scheduler.submit(c, GREEDY)
    while not all(r.done.is_set() for r in (first, second, third)):
        scheduler.run_once()
    assert left == [0]

    def items(request):
        return [request._queue.get() for _ in range(request._queue.qsize())]

    for request in (first, second):
        assert isinstance(items(request)[-1], GraphCaptureFailed)
        assert request.finish_reason == "error"
    assert [e.token_id for e in items(third)] == want[2]
    assert len(engine._free_slots) == 3
    pair = [scheduler.submit(a, GREEDY), scheduler.submit(b, GREEDY)]
    while not all(r.done.is_set() for r in pair):
        scheduler.run_once()
    assert [[e.token_id for e in items(r)] for r in pair] == want[:2]
