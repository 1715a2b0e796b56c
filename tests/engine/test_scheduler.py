"""The scheduler on the numpy backend: same tokens as a request alone, bounded stalls,
cancellation within one step, a bounded queue."""

import threading

import numpy as np
import pytest

from engine.config import EngineSettings
from engine.errors import RequestRefused
from engine.scheduled_engine import ScheduledEngine
from engine.scheduler import NO_TOKEN, QueueFull, Scheduler, SchedulerStats
from engine.session import Engine, GenerationParams

NUMPY = EngineSettings(backend="numpy")
GREEDY = GenerationParams(max_new_tokens=12, greedy=True)


def prompt(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed + length).integers(0, 400, size=length).tolist()


def solo(engine: Engine, ids: list[int], params: GenerationParams) -> list[int]:
    engine.prompt_cache.clear()
    return [e.token_id for e in engine.generate(ids, params)]


def drain(request) -> list:
    out = []
    while not request._queue.empty():
        out.append(request._queue.get())
    return out


def tokens(events: list) -> list[int]:
    return [e.token_id for e in events if e.token_id != NO_TOKEN]


def run_until_done(scheduler: Scheduler, requests, limit: int = 10_000) -> None:
    for _ in range(limit):
        if all(r.done.is_set() for r in requests):
            return
        scheduler.run_once()
    raise AssertionError("requests did not finish")


@pytest.fixture(scope="module")
def engine4(tiny_checkpoint):
    return Engine.load(
        tiny_checkpoint("untied-l8-r2", "hf-fp32"), NUMPY, context=512, streams=4, max_rows=64
    )


def test_streams_joining_at_different_steps_get_their_solo_tokens(engine4):
    """Four requests join the batch at different steps (one with a prompt of three chunks,
    one sampled with a seed); each gets exactly the tokens Engine.generate gives it alone."""
    sampled = GenerationParams(max_new_tokens=12, temperature=0.8, top_k=40, seed=7)
    cases = [(prompt(5), GREEDY), (prompt(70), GREEDY), (prompt(33), sampled)]
    cases.append((prompt(150), GREEDY))
    expected = [solo(engine4, ids, params) for ids, params in cases]
    engine4.prompt_cache.clear()
    scheduler = Scheduler(engine4)
    requests = []
    for (ids, params), wait in zip(cases, (2, 3, 1, 0), strict=True):
        requests.append(scheduler.submit(ids, params))
        for _ in range(wait):
            scheduler.run_once()
    run_until_done(scheduler, requests)
    got = [tokens(drain(r)) for r in requests]
    assert got == expected
    assert scheduler.stats.peak_running == 4
    assert sorted(engine4._free_slots) == [0, 1, 2, 3]


def test_longest_stall_of_a_running_stream_is_one_prefill_chunk(tiny_checkpoint):
    """While a 256-token prompt prefills in four 64-row chunks, a decoding stream gets a
    token after every chunk: it never waits for more than one chunk and its own step."""
    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    engine = Engine.load(model, NUMPY, context=1024, streams=2, max_rows=64)
    scheduler = Scheduler(engine)
    running = scheduler.submit(prompt(20), GenerationParams(max_new_tokens=500, greedy=True))
    for _ in range(3):
        scheduler.run_once()
    drain(running)
    scheduler.stats = SchedulerStats()
    long = scheduler.submit(prompt(256, seed=1), GREEDY)
    during = 0
    while not long._queue.qsize():
        scheduler.run_once()
        during += len(drain(running))
    stats = scheduler.stats
    assert stats.prefill_chunks == 4
    assert during == 4  # one token per iteration: the stream kept going between chunks
    assert stats.longest_gap_s <= stats.longest_chunk_s + stats.longest_step_s + 0.1
    print(
        f"\nlongest stall {stats.longest_gap_s * 1e3:.1f} ms: longest 64-row chunk "
        f"{stats.longest_chunk_s * 1e3:.1f} ms + step {stats.longest_step_s * 1e3:.1f} ms"
    )
    running.cancel()
    long.cancel()
    run_until_done(scheduler, [running, long])


def test_smaller_prefill_chunks_shorten_the_stall(tiny_checkpoint):
    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    engine = Engine.load(model, NUMPY, context=1024, streams=2, max_rows=64)
    scheduler = Scheduler(engine, prefill_chunk=16)
    running = scheduler.submit(prompt(20), GenerationParams(max_new_tokens=500, greedy=True))
    scheduler.run_once()
    long = scheduler.submit(prompt(64, seed=1), GREEDY)
    run_until_done(scheduler, [long])
    assert scheduler.stats.prefill_chunks == 2 + 4  # 20 rows, then 64, in chunks of 16
    running.cancel()
    run_until_done(scheduler, [running])


def test_cancel_frees_the_slot_within_one_step(engine4):
    scheduler = Scheduler(engine4)
    a = scheduler.submit(prompt(10), GenerationParams(max_new_tokens=100, greedy=True))
    scheduler.run_once()
    scheduler.run_once()
    assert scheduler.running == 1 and len(engine4._free_slots) == 3
    a.cancel()
    scheduler.run_once()
    final = drain(a)[-1]
    assert final.finished and final.finish_reason == "cancelled"
    assert scheduler.running == 0 and len(engine4._free_slots) == 4
    # A request cancelled while it waits never takes a slot.
    b = scheduler.submit(prompt(10), GREEDY)
    b.cancel()
    scheduler.run_once()
    assert drain(b)[-1].finish_reason == "cancelled" and len(engine4._free_slots) == 4


def test_queue_full_is_refused_naming_the_queue_and_the_setting(tiny_checkpoint):
    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    engine = Engine.load(model, NUMPY, context=256, streams=1, max_rows=64)
    scheduler = Scheduler(engine, queue_size=1)
    first = scheduler.submit(prompt(8), GREEDY)
    second = scheduler.submit(prompt(8), GREEDY)
    with pytest.raises(QueueFull, match=r"queue size 1.*--queue"):
        scheduler.submit(prompt(8), GREEDY)
    with pytest.raises(RequestRefused, match="context is 256"):
        scheduler.submit(prompt(300), GREEDY)
    run_until_done(scheduler, [first, second])
    assert scheduler.stats.peak_running == 1 and scheduler.stats.refused == 1
    # The app's scheduler (its chat and its server share it) names the app's setting.
    scheduled = ScheduledEngine(engine, queue_size=0)
    try:
        with scheduled.scheduler._cond:  # the one stream held: the next request finds no room
            scheduled.scheduler._running.append(first)
            with pytest.raises(QueueFull, match=r"Load tab, Streams") as refused:
                scheduled.scheduler.submit(prompt(8), GREEDY)
            scheduled.scheduler._running.clear()
        assert "--" not in str(refused.value)
    finally:
        scheduled.unload()


def test_a_failing_request_leaves_the_others_running(engine4):
    class Failing(Scheduler):
        def _first_token(self, request, logits):
            if len(request.prompt_ids) == 7:
                raise RequestRefused("refused for this test")
            return super()._first_token(request, logits)

    scheduler = Failing(engine4)
    good = scheduler.submit(prompt(9), GREEDY)
    bad = scheduler.submit(prompt(7), GREEDY)
    run_until_done(scheduler, [good, bad])
    assert isinstance(drain(bad)[-1], RequestRefused)
    assert tokens(drain(good)) == solo(engine4, prompt(9), GREEDY)
    assert len(engine4._free_slots) == 4


def test_threaded_requests_match_engine_generate(engine4):
    """The loop on its own thread, requests from several threads (`Scheduler.generate`)."""
    cases = [prompt(n, seed=3) for n in (4, 20, 40)]
    expected = [solo(engine4, ids, GREEDY) for ids in cases]
    engine4.prompt_cache.clear()
    got: dict[int, list[int]] = {}
    with Scheduler(engine4) as scheduler:

        def client(i: int) -> None:
            got[i] = [e.token_id for e in scheduler.generate(cases[i], GREEDY)]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert [got[i] for i in range(len(cases))] == expected


def test_scheduled_engine_serves_the_app_path(tiny_checkpoint):
    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    engine = Engine.load(model, NUMPY, context=256, streams=2, max_rows=64)
    ids = engine.chat_ids([{"role": "user", "content": "Hello"}])
    expected = solo(engine, ids, GREEDY)
    engine.prompt_cache.clear()
    scheduled = ScheduledEngine(engine)
    assert scheduled.backend_name == "numpy"
    assert scheduled.held_bytes() == engine.held_bytes()
    assert scheduled.chat_ids([{"role": "user", "content": "Hello"}]) == ids
    events = list(scheduled.generate(ids, GREEDY))
    assert [e.token_id for e in events] == expected and events[-1].stats is not None
    cancel = threading.Event()
    events = []
    # A reply far longer than the engine thread can finish while this one reads three
    # tokens (12 could all be decoded before the cancel arrived).
    long = GenerationParams(max_new_tokens=200, greedy=True)
    for event in scheduled.generate(ids, long, cancel):
        events.append(event)
        if len(events) == 3:
            cancel.set()
    assert events[-1].finish_reason == "cancelled" and len(events) < 200
    scheduled.unload()
    with pytest.raises(RequestRefused, match="stopped"):
        scheduled.scheduler.submit(ids, GREEDY)


def test_host_buffers_for_the_next_moves_are_pinned_only_once_none_decodes(engine4, monkeypatch):
    """Pinning host memory holds every launch, so the buffers for the next reply's moves
    (`TieredPromptCache.ready_next`) are pinned when the last running request has had its
    final event, not while another stream decodes or waits."""
    readied: list[tuple[int, int]] = []
    scheduler = Scheduler(engine4)
    cache = engine4.prompt_cache
    monkeypatch.setattr(
        cache,
        "ready_next",
        lambda: readied.append((len(scheduler._running), sum(r.done.is_set() for r in reqs))),
    )
    short = GenerationParams(max_new_tokens=3, greedy=True)
    reqs = [scheduler.submit(prompt(6, seed=1), short)]
    reqs.append(
        scheduler.submit(prompt(6, seed=2), GenerationParams(max_new_tokens=9, greedy=True))
    )
    run_until_done(scheduler, reqs)
    assert readied == [(0, 2)]  # once: after the longer one's final event, none running
    assert all(tokens(drain(r)) for r in reqs)


def test_a_prompt_admitted_beside_the_same_prompt_reads_its_history_once(engine4):
    """Three requests of one chat prompt admitted together (as a request's `n` replies
    are): prefills go one at a time, and each after the first restores the state the first
    saved at the prompt's end, with its last logits, instead of reading the conversation
    again; each reply is the one it gets alone."""
    history = []
    for i in range(6):
        history += [
            {"role": "user", "content": f"Question {i} about the harbour and its boats?"},
            {"role": "assistant", "content": f"Answer {i}: the boats leave at dawn."},
        ]
    ids = engine4.chat_ids([*history, {"role": "user", "content": "And the tides?"}])
    cut = engine4.turn_start(ids)
    assert cut and 64 < cut < len(ids)
    expected = solo(engine4, ids, GREEDY)
    engine4.prompt_cache.clear()
    scheduler = Scheduler(engine4)
    requests = [scheduler.submit(ids, GREEDY) for _ in range(3)]
    run_until_done(scheduler, requests)
    events = [drain(r) for r in requests]
    assert [tokens(e) for e in events] == [expected] * 3
    assert [e[-1].stats.cached_tokens for e in events] == [0, len(ids), len(ids)]
    assert engine4.prompt_cache.stats.whole == 2


def test_closing_tells_the_requests_it_stops_and_keeps_the_cancelled_ones_cancelled(engine4):
    """A request the scheduler stops at its close (the model unloaded under a server's
    client) ends with the refusal that says so, not as a reply that ended; one its caller
    had cancelled ends as cancelled; every slot comes back."""
    scheduler = Scheduler(engine4)
    running, cancelled, queued = (scheduler.submit(prompt(20, i), GREEDY) for i in range(3))
    scheduler.run_once()  # the first chunk of a prompt: requests under way
    cancelled.cancel()
    scheduler.close()
    assert drain(cancelled)[-1].finish_reason == "cancelled"
    for request in (running, queued):
        last = drain(request)[-1]
        assert isinstance(last, RequestRefused) and "stopped" in str(last)
        assert request.done.is_set() and request.cancelled
    assert scheduler.running == scheduler.waiting == 0 and len(engine4._free_slots) == 4


def test_closing_waits_for_the_step_launched_ahead(tiny_checkpoint):
    """Steps launched ahead (the GPU's decode, the numpy backend's `launch_ahead`): the one
    in flight at the close ends before the requests are told and the engine may unload."""
    engine = Engine.load(tiny_checkpoint("untied-l8-r2", "hf-fp32"), NUMPY, context=256,
                         streams=2, max_rows=64)  # fmt: skip
    engine.backend.launch_ahead = True
    launched, read = [], []

    class Watched:
        def __init__(self, pending):
            self.pending = pending
            launched.append(self)

        def tokens(self):
            read.append(self)
            return self.pending.tokens()

    step = engine.backend.launch_step
    engine.backend.launch_step = lambda *a: Watched(step(*a))
    scheduler = Scheduler(engine)
    request = scheduler.submit(prompt(20), GenerationParams(max_new_tokens=40, greedy=True))
    while len(launched) < 3:
        scheduler.run_once()
    assert scheduler._ahead is not None and launched[-1] not in read
    scheduler.close()
    assert launched[-1] in read and scheduler._ahead is None
    assert isinstance(drain(request)[-1], RequestRefused)
    engine.unload()
