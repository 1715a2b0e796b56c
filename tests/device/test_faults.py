"""Allocation failures at every site of the CUDA path, on the real pool (docs/reliability.md).

Each test injects one failure where the engine allocates: the weights and the stream state
at load, the decode step's buffers (CuPy's own pool), the eager warm-up's scratch, workspace
and graphs, a saved prompt state on the card or in pinned host memory, a lazy scratch or
workspace grow, and a decode graph's capture. Each shows the named error the user gets (and
the setting it names), that what was held before is kept (the same blocks, the same bytes, a
reply in flight ending with the tokens it has alone), and that the engine serves the next
request. The pool's failures come from `fail_next`; the others from CuPy's allocator, the
pinned allocation or the stream's capture made to fail as CUDA does when it has no memory.
fp32 throughout, so tokens compare exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.errors import (
    DeviceOutOfMemory,
    GraphCaptureFailed,
    RequestRefused,
    ScratchGrowFailed,
    WorkspaceGrowFailed,
)
from engine.scheduler import Scheduler
from engine.session import Engine, GenerationParams

GREEDY = GenerationParams(max_new_tokens=24, greedy=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("faults") / "tiny", "tiny", "mlx4", seed=5)
    write_tokenizer(path)
    return path


def cuda(**kw):
    return EngineSettings(backend="cuda", compute_dtype="float32", **kw)


def prompt(n, seed=0):
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


def tokens(engine, ids, params=GREEDY):
    return [e.token_id for e in engine.generate(ids, params)]


def solo(engine, ids):
    engine.prompt_cache.clear()
    out = tokens(engine, ids)
    engine.prompt_cache.clear()
    return out


def armed_pools(monkeypatch, faults: dict[str, int]) -> list:
    """Every CupyPool made from now on starts with `faults` armed (`fail_next`); returns the
    pools made, for their ledgers."""
    import engine.memory as memory

    made = []

    class Armed(memory.CupyPool):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for what, count in faults.items():
                self.fail_next(what, count)
            made.append(self)

    monkeypatch.setattr(memory, "CupyPool", Armed)
    return made


def failing_captures(monkeypatch, count: int) -> list[int]:
    """The next `count` graph captures end as an instantiation without memory does: the
    stream's capture is over and CUDA answers cudaErrorMemoryAllocation. Returns [left]."""
    import cupy

    real, left = cupy.cuda.Stream.end_capture, [count]

    def end_capture(self, *args, **kwargs):
        graph = real(self, *args, **kwargs)
        if left[0]:
            left[0] -= 1
            del graph
            raise cupy.cuda.runtime.CUDARuntimeError(2)
        return graph

    monkeypatch.setattr(cupy.cuda.Stream, "end_capture", end_capture)
    return left


class FailingCupyAllocations:
    """While entered, CuPy's own device allocations fail as its pool does on a full card;
    `calls` counts them."""

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self, nbytes):
        import cupy

        self.calls += 1
        raise cupy.cuda.memory.OutOfMemoryError(nbytes, 0)

    def __enter__(self):
        import cupy

        self._saved = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(self._fail)
        return self

    def __exit__(self, *exc):
        import cupy

        cupy.cuda.set_allocator(self._saved)


def blocks(engine) -> dict[str, int]:
    """Bytes the pool holds per tag, the saved prompt states (which requests add) aside."""
    return {t: n for t, n in engine.backend.pool.held_by_tag().items() if t != "prompt_cache"}


def run_until(scheduler, done, limit=5_000):
    for _ in range(limit):
        if done():
            return
        scheduler.run_once()
    raise AssertionError("the scheduler did not get there")


def events(request) -> list:
    out = []
    while not request._queue.empty():
        out.append(request._queue.get())
    return out


def ids_of(items) -> list[int]:
    return [e.token_id for e in items if not isinstance(e, BaseException) and e.token_id >= 0]


# ----- load ---------------------------------------------------------------------------------
LOAD_SITES = {
    # site: (error, words of its message: what failed and the setting to change)
    "weights": (DeviceOutOfMemory, ("the model's weights", "4-bit", "SNUG_MEMORY_LIMIT_GIB")),
    "stream": (DeviceOutOfMemory, ("KV cache", "number of streams", "SNUG_MEMORY_LIMIT_GIB")),
    "scratch": (ScratchGrowFailed, ("scratch could not grow", "max rows")),
    "workspace": (WorkspaceGrowFailed, ("workspace could not grow", "max rows")),
    "capture": (GraphCaptureFailed, ("CUDA graph", "SNUG_MEMORY_RESERVE_GIB")),
    "step_buffers": (DeviceOutOfMemory, ("sampling buffers", "SNUG_MEMORY_RESERVE_GIB")),
}


@pytest.mark.parametrize("site", list(LOAD_SITES))
def test_a_failed_load_is_named_holds_nothing_and_spares_a_loaded_engine(
    model_dir, site, monkeypatch
):
    """A second load fails at `site` (eager, so warm-up allocates scratch and workspace and
    captures the graphs) while a reply of a loaded engine is in flight: the named error, the
    failed load's pool holds nothing, the reply ends with its solo tokens, the loaded
    engine's blocks are unchanged, and a load after it works."""
    from engine.backends.cuda.sampling import Sampling

    first = Engine.load(model_dir, cuda(), context=1024, streams=2, max_rows=128)
    ids = prompt(60, seed=1)
    want = solo(first, ids)
    reply = first.generate(ids, GREEDY)
    head = [next(reply).token_id for _ in range(5)]
    held = blocks(first)
    error, words = LOAD_SITES[site]
    in_pool = site in ("weights", "stream", "scratch", "workspace")
    pools = armed_pools(monkeypatch, {site: 1} if in_pool else {})
    if site == "capture":
        left = failing_captures(monkeypatch, 1)
    if site == "step_buffers":
        failing = FailingCupyAllocations()
        real = Sampling.alloc

        def alloc(self, *args):
            with failing:
                real(self, *args)

        monkeypatch.setattr(Sampling, "alloc", alloc)
    with pytest.raises(error) as info:
        Engine.load(model_dir, cuda(), context=1024, streams=2, max_rows=128, eager=True)
    message = str(info.value)
    print(f"\n[{site}] {type(info.value).__name__}: {message}")
    assert all(w in message for w in words), message
    (failed,) = pools
    assert failed.held_bytes == 0 and failed.pending_faults() == {}
    if site == "capture":
        assert left == [0]
    if site == "step_buffers":
        assert failing.calls == 1
    assert head + [e.token_id for e in reply] == want  # the reply in flight goes on
    assert blocks(first) == held
    monkeypatch.undo()
    again = Engine.load(model_dir, cuda(), context=1024, streams=2, max_rows=128)
    assert tokens(again, ids) == want
    again.unload()
    first.unload()


# ----- the prompt cache -------------------------------------------------------------------
def test_no_room_on_the_card_for_a_saved_state_keeps_the_reply_and_the_old_states(model_dir):
    """A saved state the card has no room for goes to the host tier; the reply is whole, the
    states saved before stay restorable, the card holds no more than before."""
    engine = Engine.load(model_dir, cuda(), context=1024, streams=2, max_rows=128)
    first, second = prompt(80, seed=2), prompt(70, seed=3)
    want_second = solo(engine, second)
    reply = solo(engine, first)
    follow = first + reply + prompt(12, seed=4)
    want_follow = solo(engine, follow)
    assert tokens(engine, first) == reply  # its states are saved on the card
    pool, cache = engine.backend.pool, engine.prompt_cache
    held, on_card = pool.held_bytes, len(cache.device)
    pool.fail_next("prompt_cache", 100)
    assert tokens(engine, second) == want_second
    assert pool.pending_faults()["prompt_cache"] < 100  # the site was reached
    pool.fail_next("prompt_cache", 0)
    assert pool.held_bytes == held and len(cache.device) == on_card
    assert cache.device.lookup(second + [0]) is None
    assert cache.host.lookup(second + [0]) is not None  # kept in pinned host memory instead
    hits = cache.stats.hits["device"]
    assert tokens(engine, follow) == want_follow
    assert cache.stats.hits["device"] == hits + 1  # the state saved before, restored intact
    engine.unload()


def test_no_pinned_host_memory_for_a_saved_state_keeps_the_reply(model_dir, monkeypatch):
    """Where the plan keeps the saved states in pinned host memory and the host has none to
    pin: the reply is whole, nothing is kept for it (its next turn prefills its history),
    the states saved before stay restorable."""
    import dataclasses

    import cupy

    import engine.session as session

    admit = session.admit_load

    def on_host(*args, **kw):
        return dataclasses.replace(admit(*args, **kw), prompt_cache_on_host=True)

    monkeypatch.setattr(session, "admit_load", on_host)
    engine = Engine.load(model_dir, cuda(), context=1024, streams=2, max_rows=128)
    first, second = prompt(80, seed=5), prompt(70, seed=6)
    want_second = solo(engine, second)
    reply = solo(engine, first)
    follow = first + reply + prompt(12, seed=7)
    want_follow = solo(engine, follow)
    assert tokens(engine, first) == reply  # its states are saved in pinned host memory
    cache, held = engine.prompt_cache, engine.backend.pool.held_by_tag()
    kept, calls = len(cache), []

    def no_memory_to_pin(size, flags=0):  # cudaHostAlloc without memory
        calls.append(size)
        raise cupy.cuda.runtime.CUDARuntimeError(2)

    with monkeypatch.context() as patch:
        patch.setattr(cupy.cuda, "PinnedMemory", no_memory_to_pin)
        assert tokens(engine, second) == want_second
    assert calls and len(cache) == kept
    assert cache.lookup(second + [0]) is None  # nothing kept: its next turn prefills
    assert engine.backend.pool.held_by_tag() == held
    hits = cache.stats.hits["device"]
    assert tokens(engine, follow) == want_follow
    assert cache.stats.hits["device"] == hits + 1  # the state saved before, restored intact
    again = tokens(engine, second)
    assert again == want_second
    # States in host memory are saved at a reply's end only: the reply's end is kept.
    assert cache.lookup(second + again + [0]) is not None
    # The saved states' pinned buffers go back to the host when dropped: CuPy's pinned pool,
    # which would keep each for a later one of the same size, does not collect them.
    cached = cupy.get_default_pinned_memory_pool().n_free_blocks()
    for n in (90, 91, 92):
        tokens(engine, prompt(n, seed=n))
    cache.clear()
    assert cupy.get_default_pinned_memory_pool().n_free_blocks() == cached
    engine.unload()


# ----- growth and capture under load: the scheduler --------------------------------------
@pytest.mark.parametrize("site", ["scratch", "workspace"])
def test_a_failed_grow_refuses_one_request_and_the_running_one_finishes(model_dir, site):
    """Lazy path: a request whose prompt needs a larger `site` is refused by name while
    another decodes; the running one ends with its solo tokens, the blocks are the same,
    the pool holds the same bytes, and the same prompt is served once there is room."""
    engine = Engine.load(model_dir, cuda(), context=1024, streams=2, max_rows=512, eager=False)
    be, fr = engine.backend, engine.backend.frame
    if site == "workspace":
        fr.mem_scratch.ensure(512)  # the scratch has room: only the workspace must grow
    short, long = prompt(40, seed=8), prompt(300, seed=9)
    want = solo(engine, short)
    buffers = {"scratch": fr.mem_scratch, "workspace": fr.mem_workspace}
    before = {k: (b.block, b.capacity_rows) for k, b in buffers.items()}
    scheduler = Scheduler(engine)
    running = scheduler.submit(short, GREEDY)
    run_until(scheduler, lambda: len(running.generated) >= 3)
    held = blocks(engine)
    be.pool.fail_next(site)
    refused = scheduler.submit(long, GREEDY)
    run_until(scheduler, lambda: refused.done.is_set() and running.done.is_set())
    error = events(refused)[-1]
    print(f"\n[{site}] {type(error).__name__}: {error}")
    assert isinstance(error, ScratchGrowFailed if site == "scratch" else WorkspaceGrowFailed)
    assert "300 rows" in str(error) and "max rows" in str(error)
    assert be.pool.pending_faults() == {}
    assert ids_of(events(running)) == want
    assert {k: (b.block, b.capacity_rows) for k, b in buffers.items()} == before
    assert blocks(engine) == held
    again = scheduler.submit(long, GREEDY)
    run_until(scheduler, again.done.is_set)
    got = ids_of(events(again))
    assert buffers[site].capacity_rows == 512 and got == solo(engine, long)
    engine.unload()


def test_a_failed_capture_refuses_its_step_and_a_prefilling_request_finishes(
    model_dir, monkeypatch
):
    """The decode graph of two streams is missing (as after a capture refused earlier) and
    cannot be captured at the step that needs it. The two requests of that step are refused
    by name; a third, still prefilling, finishes with its solo tokens on the one-stream
    graph (kept: the same object); two requests later get their own tokens on a graph of
    two captured then."""
    engine = Engine.load(model_dir, cuda(), context=1024, streams=3, max_rows=128, eager=False)
    graphs = engine.backend.graphs
    a, b, c = prompt(20, seed=10), prompt(10, seed=11), prompt(300, seed=12)
    want = {name: solo(engine, ids) for name, ids in (("a", a), ("b", b), ("c", c))}
    scheduler = Scheduler(engine, prefill_chunk=64)
    first = scheduler.submit(a, GREEDY)
    run_until(scheduler, lambda: len(first.generated) >= 3)
    one, held = graphs.graphs[1], blocks(engine)
    graphs.graphs.pop(2, None)  # a step of two streams must capture its graph
    left = failing_captures(monkeypatch, 1)
    second, third = scheduler.submit(b, GREEDY), scheduler.submit(c, GREEDY)
    run_until(scheduler, lambda: all(r.done.is_set() for r in (first, second, third)))
    assert left == [0]
    for request in (first, second):
        error = events(request)[-1]
        assert isinstance(error, GraphCaptureFailed) and isinstance(error, RequestRefused)
        assert "2 streams" in str(error) and "SNUG_MEMORY_RESERVE_GIB" in str(error)
    print(f"\n[capture] {error}")
    assert ids_of(events(third)) == want["c"]
    assert graphs.graphs[1] is one and 2 not in graphs.graphs
    assert blocks(engine) == held
    engine.prompt_cache.clear()
    pair = [scheduler.submit(a, GREEDY), scheduler.submit(b, GREEDY)]
    run_until(scheduler, lambda: all(r.done.is_set() for r in pair))
    assert [ids_of(events(r)) for r in pair] == [want["a"], want["b"]]
    assert 2 in graphs.graphs and all(r.finish_reason != "error" for r in pair)
    engine.unload()
