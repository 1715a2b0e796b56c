"""What CUDA warm-up runs so that a first request compiles, tunes and creates nothing
(engine/backends/cuda/warmup.py), decided without a GPU: the windows it runs, the draws that
cover every kernel of the device sampler (the app's and the server's defaults included), the
order of its steps on a stand-in backend; and the process-wide pieces it relies on: one
cuBLAS handle a device for every thread, the count of kernel modules made, and a card's
properties read as another card's (SNUG_DEVICE_PROPS). The device side is
tests/device/test_warmup.py and tests/device/test_small_card_props.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from engine.backends.cuda import blas, launch, modules, warmup
from engine.backends.cuda.card import Card
from engine.backends.cuda.gemv_plan import GEMV_MAX_ROWS
from engine.backends.cuda.sampling import Sampling, draw_symbol
from engine.backends.cuda.tuning import Tuning
from engine.config import EngineSettings, parse_device_props
from engine.errors import ConfigError
from engine.sampling import Sampler, SamplingParams
from engine.session import aligned_chunks
from tests.engine.cuda_fakes import RecordingKernels

# ----- the windows ----------------------------------------------------------------------------


def test_eager_warm_up_runs_every_decode_size_doubling_sizes_and_long_keys():
    plan = warmup.window_plan(512, 8192, eager=True)
    assert warmup.first_rows(512, 8192, True) == 512
    at_zero = [rows for start, rows in plan if start == 0]
    assert at_zero == [2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256]
    # max-row windows ending at 1K, 2K, 4K keys and at the context
    assert [w for w in plan if w[0]] == [(512, 512), (1536, 512), (3584, 512), (7680, 512)]


def test_lazy_warm_up_stays_within_its_first_window():
    assert warmup.first_rows(512, 8192, False) == warmup.LAZY_ROWS == 64
    plan = warmup.window_plan(512, 8192, eager=False)
    assert plan == [(0, r) for r in (2, 3, 4, 5, 6, 7, 8, 16, 32)]


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize(
    "max_rows, context", [(512, 8192), (256, 1000), (8, 64), (512, 5), (128, 262144), (1, 40)]
)
def test_every_window_fits_and_every_decode_size_is_covered(max_rows, context, eager):
    top = warmup.first_rows(max_rows, context, eager)
    plan = warmup.window_plan(max_rows, context, eager)
    assert all(start >= 0 and 1 < rows <= top and start + rows <= context for start, rows in plan)
    sizes = {rows for _, rows in plan} | {1, top}  # 1 row is a step; top is the first window
    assert set(range(1, min(GEMV_MAX_ROWS, top) + 1)) <= sizes
    ends = [start + rows for start, rows in plan if start]
    if eager and context > top > 1:
        assert ends[-1] == context and ends == sorted(ends)
        assert all(b == 2 * a for a, b in zip(ends[:-2], ends[1:-1], strict=True))
    else:
        assert ends == []


@pytest.mark.parametrize("length", [7, 300, 511, 512, 513, 1030, 8000])
def test_a_chat_prompts_windows_are_all_warmed_sizes(length):
    """A chat prompt is cut at its last turn start (the generation prompt, 7 tokens with
    thinking off): its last window has decode-sized rows, and the one before it any size."""
    warmed = {rows for _, rows in warmup.window_plan(512, 8192, True)} | {1, 512}
    for cut in (length - 7, length - 5):
        if cut <= 0:
            continue
        for start, end in aligned_chunks(0, length, 512, cut):
            rows = end - start
            assert rows in warmed or rows > GEMV_MAX_ROWS, (length, cut, rows)


# ----- the draws ------------------------------------------------------------------------------
class Rows:
    """A device array as Sampling reads it: shape, row stride, pointer, size, dtype (an
    integer of `itemsize` bytes), contiguity; an index or a slice of rows is a view, and a copy
    into it (`data.copy_from_device_async`) does nothing."""

    def __init__(self, shape: tuple, ptr: int = 1 << 20, itemsize: int = 4, row_bytes=None):
        self.shape, self.itemsize = shape, itemsize
        self.strides = (row_bytes or shape[-1] * itemsize, itemsize)[-len(shape) :]
        self.data = SimpleNamespace(ptr=ptr, copy_from_device_async=lambda src, nbytes: None)
        self.size = int(np.prod(shape))
        self.nbytes, self.dtype = self.size * itemsize, np.dtype(f"i{itemsize}")
        dense = len(shape) == 1 or self.strides[0] == shape[-1] * itemsize
        self.flags = SimpleNamespace(c_contiguous=dense)

    def __getitem__(self, i):
        if isinstance(i, int):
            return Rows(self.shape[1:], self.data.ptr + i * self.strides[0], self.itemsize)
        start, stop, _ = i.indices(self.shape[0])
        ptr = self.data.ptr + start * self.strides[0]
        return Rows((stop - start, *self.shape[1:]), ptr, self.itemsize, self.strides[0])

    def __setitem__(self, i, value):  # a copy on the device
        pass


VOCAB, REAL = 248320, 248077  # Qwen3.5's padded LM head and its real ids


def drawn(monkeypatch, draws, logits=None, in_place=True) -> set[str]:
    """The kernels Sampling.rows launches for one decode row per draw."""
    import cupy

    monkeypatch.setattr(cupy, "asarray", lambda a: a)  # the ids to mark, as the host has them
    k = RecordingKernels()
    s = Sampling(k, None, Tuning())
    n = len(draws)
    s.seen, s.picks = Rows((n, VOCAB // 32)), Rows((64,))
    s.draw_cand = (Rows((8192,)),) * 3
    logits = logits or Rows((n, VOCAB))
    s.rows(logits, Rows((64,)), list(draws), REAL, in_place)
    return {launch_[0] for launch_ in k.launches}


def test_the_warm_draws_launch_every_kernel_of_a_device_draw(monkeypatch):
    aligned = drawn(monkeypatch, warmup.draws(0))
    assert aligned == {"mark_seen", "draw_candidates", draw_symbol(True)}
    assert drawn(monkeypatch, warmup.draws(0), in_place=False) == aligned
    # a row that is not 16-byte aligned (an odd vocabulary, a second row) reads one by one
    odd = Rows((2, VOCAB - 1), itemsize=4)
    assert drawn(monkeypatch, [None, *warmup.draws(1)[:1]], odd) >= {draw_symbol(False)}


def app_defaults() -> SamplingParams:
    """The chat's sampling settings as the app ships them (app/state/settings.py)."""
    pytest.importorskip("PySide6")
    from app.state.settings import BY_KEY

    keys = ("temperature", "top_k", "top_p", "min_p", "presence_penalty")
    return SamplingParams(**{k: BY_KEY[f"sampling/{k}"].default for k in keys})


@pytest.mark.parametrize(
    "params",
    [
        "app",
        SamplingParams(),  # the server's: a request that sets nothing
        SamplingParams(greedy=True, presence_penalty=1.5),
        SamplingParams(top_k=1024, top_p=1.0, presence_penalty=-2.0),
        SamplingParams(top_k=33, temperature=2.0),
    ],
)
def test_what_a_request_draws_on_the_device_is_warmed(monkeypatch, params):
    if params == "app":
        params = app_defaults()
        assert params.presence_penalty == 1.5 and params.top_k == 20  # the split draw's
    sampler = Sampler(params, REAL)
    assert sampler.on_device
    request = [sampler.device_draw([5, 9], 0), sampler.device_draw([5, 9, 3], 0)]
    warmed = drawn(monkeypatch, warmup.draws(0))
    for draw in request:
        assert drawn(monkeypatch, [draw]) <= warmed


# ----- the order on a stand-in backend --------------------------------------------------------
class StandIn:
    """The backend calls warm_requests makes, recorded."""

    def __init__(self, slots=2, room=None, on_host=False, launches=True):
        self.max_rows, self.snapshot_room, self.launches_steps = 256, room, launches
        self.state = SimpleNamespace(context=2048, slots=slots, snapshots_on_host=on_host)
        self.frame = SimpleNamespace(meta=np.zeros((4, 64), np.int32))
        self.calls: list[tuple] = []

    def forward(self, batch, ids):
        self.calls.append(
            ("forward", batch.is_step, [(s.slot, s.start, s.rows) for s in batch.segments])
        )
        return "logits"

    def to_host(self, x):
        self.calls.append(("to_host", x))

    def sample_greedy(self, logits, out=None):
        self.calls.append(("greedy", out.shape))

    def sample_rows(self, logits, greedy, rows, *, in_place=False):
        self.calls.append(("draw", tuple(d and (d.slot, d.top_k) for d in rows), in_place))

    def launch_step(self, batch, ids, rows):
        B = len(rows)
        self.calls.append(("launch", batch and batch.rows, tuple(d and d.slot for d in rows)))
        return SimpleNamespace(tokens=lambda: [0] * B)

    def snapshot_bytes(self, length):
        return 1000 * length

    def save_slot(self, slot, length):
        self.calls.append(("save", slot, length))
        return "snapshot"

    def restore_slot(self, slot, snapshot):
        self.calls.append(("restore", slot, snapshot))

    def free_snapshot(self, snapshot):
        self.calls.append(("free", snapshot))


def test_warm_requests_runs_each_part_in_order():
    be = StandIn(slots=2)
    model = SimpleNamespace(forward=be.forward)
    warmup.warm_requests(be, model, eager=True)
    calls = be.calls
    windows = [c[2][0] for c in calls if c[0] == "forward" and not c[1]]
    assert windows == [(0, s, r) for s, r in warmup.window_plan(256, 2048, True)]
    assert ("forward", True, [(0, 0, 1), (1, 0, 1)]) in calls  # a step of every slot
    assert ("to_host", "logits") in calls and ("greedy", (2,)) in calls
    draws = [c[1:] for c in calls if c[0] == "draw"]
    want = [
        (tuple((i, d.top_k) if j == i else None for j in range(2)), in_place)
        for i in range(2)
        for d in warmup.draws(i)
        for in_place in (False, True)
    ]
    assert draws == want
    launches = [c[1:] for c in calls if c[0] == "launch"]
    assert launches == [(1, (None,)), (None, (0,)), (2, (None, None)), (None, (0, 1))]
    assert calls[-3:] == [("save", 0, 1), ("restore", 0, "snapshot"), ("free", "snapshot")]


@pytest.mark.parametrize(
    "room, on_host, saved", [(None, False, True), (1000, False, True), (999, False, False),
                             (10**9, True, False)],
)  # fmt: skip
def test_a_saved_state_is_warmed_only_where_the_plan_puts_one_on_the_card(room, on_host, saved):
    be = StandIn(slots=1, room=room, on_host=on_host)
    warmup.warm_snapshots(be)
    assert (("save", 0, 1) in be.calls) == saved
    assert be.calls.count(("free", "snapshot")) == int(saved)


def test_no_launched_steps_where_the_backend_cannot_launch_them():
    be = StandIn(slots=1, launches=False)
    warmup.warm_launch(be)
    assert be.calls == []


# ----- process-wide pieces --------------------------------------------------------------------
def test_one_cublas_handle_a_device_serves_every_thread(monkeypatch):
    import cupy

    made = []
    monkeypatch.setattr(blas, "_HANDLES", {})
    monkeypatch.setattr(blas, "_create", lambda: made.append(1) or 1000 + len(made))
    monkeypatch.setattr(cupy.cuda, "Device", lambda: SimpleNamespace(id=0))
    first = blas.handle()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(blas.handle()))
    worker.start()
    worker.join()
    assert seen == [first] and made == [1] and blas.handles() == {0: first}
    monkeypatch.setattr(cupy.cuda, "Device", lambda: SimpleNamespace(id=1))
    assert blas.handle() != first and len(made) == 2


def test_modules_built_counts_each_compile_or_load(monkeypatch):
    import cupy

    class Module:
        def __init__(self, **kw):
            self.kw = kw

        def get_function(self, name):
            return (name, self.kw.get("name_expressions"))

    monkeypatch.setattr(cupy, "RawModule", Module)
    before = modules.built()
    modules.function("norm.cu", "warm_probe_symbol", "float32")
    modules.function("norm.cu", "warm_probe_symbol", "float32")  # kept for the process
    assert modules.built() == before + 1
    modules.module("sample.cu", "float32", ["a<1>"])
    modules.module("sample.cu", "float32", ["a<1>"])  # a module is made at each call
    assert modules.built() == before + 3


def test_device_props_parse_into_card_properties():
    assert parse_device_props("") == {}
    small = parse_device_props(" sms=20, l2_mb=2 ,smem_kb=99")
    assert small == {"sm_count": 20, "l2_bytes": 2 << 20, "smem_per_block": 99 * 1024}
    env = EngineSettings.from_env({"SNUG_DEVICE_PROPS": "sms=20,l2_mb=2,smem_kb=99"})
    assert parse_device_props(env.device_props) == small
    assert EngineSettings.from_env({}).device_props == ""
    assert parse_device_props("sms=1024")["sm_count"] == 1024
    for bad in ("sms=0", "sms=twenty", "l2=2", "sms", "smem_kb=-1", "sms=99999999999999999999"):
        with pytest.raises(ConfigError, match="SNUG_DEVICE_PROPS"):
            EngineSettings(device_props=bad)


def test_simulated_properties_replace_the_cards_own(monkeypatch):
    import cupy

    asked = []

    def props(dev):
        asked.append(dev)
        return {
            "multiProcessorCount": 132,
            "l2CacheSize": 60 << 20,
            "sharedMemPerBlockOptin": 232448,
        }

    monkeypatch.setattr(cupy.cuda, "Device", lambda: SimpleNamespace(id=3))
    monkeypatch.setattr(cupy.cuda.runtime, "getDeviceProperties", props)
    monkeypatch.setattr(launch, "_PROPERTIES", {})
    monkeypatch.setattr(launch, "_SIMULATED", {})
    monkeypatch.setattr(launch, "_CAPABILITY", {3: 90})
    assert launch.card() == Card(90, 132, 60 << 20, 232448)
    launch.simulate(parse_device_props("sms=20,l2_mb=2,smem_kb=99"))
    assert launch.card() == Card(90, 20, 2 << 20, 99 * 1024)  # the capability stays the card's
    assert launch.grid_cap() == 16 * 20
    launch.simulate(parse_device_props("sms=20,l2_mb=2,smem_kb=99"))  # the same: not asked
    assert launch.sm_count() == 20 and asked == [3, 3]
    launch.simulate({})
    assert launch.card() == Card(90, 132, 60 << 20, 232448) and asked == [3, 3, 3]
