"""The prompt cache's tiers on the numpy backend (fp32): a conversation saved to disk and
resumed by a new engine (and by a new process) is the uninterrupted run bit for bit; the
prefill's windows fall at the same absolute positions restored or not; snapshots move down
the tiers; the scheduler (the server's path) restores from whichever tier has the state."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import engine.prompt_cache as prompt_cache
import engine.session as session
from engine.config import EngineSettings
from engine.scheduler import NO_TOKEN, Scheduler
from engine.session import Engine, GenerationParams, aligned_chunks
from engine.snapshot_store import entry_name

NUMPY = EngineSettings(backend="numpy")
GREEDY = GenerationParams(max_new_tokens=10, greedy=True)
ROOT = Path(__file__).resolve().parents[2]


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, size=length).tolist()


def on_disk(folder: Path, **kw) -> EngineSettings:
    return dataclasses.replace(NUMPY, prompt_cache_dir=str(folder), **kw)


def load(model: Path, settings: EngineSettings = NUMPY, **kw) -> Engine:
    return Engine.load(model, settings, context=512, max_rows=64, **kw)


def tokens(engine: Engine, ids: list[int]) -> list[int]:
    return [e.token_id for e in engine.generate(ids, GREEDY)]


@pytest.fixture(scope="module")
def model(tiny_checkpoint) -> Path:
    return tiny_checkpoint("tied-l8-r4-hd64", "hf-fp32")


@pytest.fixture(scope="module")
def turn(model, tmp_path_factory):
    """One turn saved to disk: (folder, first prompt, reply, follow-up prompt)."""
    folder = tmp_path_factory.mktemp("prompt-cache")
    first = prompt(150, seed=5)
    engine = load(model, on_disk(folder))
    reply = tokens(engine, first)
    engine.unload()  # finishes the disk writes
    return folder, first, reply, first + reply + prompt(70, seed=6)


def uninterrupted(model: Path, first: list[int], reply: list[int], follow: list[int]):
    """The follow-up's logits on a stream that went on: prefill, the reply fed one step at
    a time (as `generate` feeds it), then the rest; nothing saved, nothing restored."""
    engine = load(model)
    stream = engine._open_stream()
    engine.prefill(stream, first)
    for token in reply[:-1]:  # the last token of a reply is never fed
        engine.step([stream], [token])
    return engine.prefill(stream, follow[len(stream.ids) :], all_logits=True)


def test_windows_end_at_multiples_of_max_rows_and_at_the_cut():
    assert list(aligned_chunks(0, 150, 64)) == [(0, 64), (64, 128), (128, 150)]
    assert list(aligned_chunks(159, 70, 64)) == [(0, 33), (33, 70)]  # to 192, then 229
    assert list(aligned_chunks(0, 150, 64, cut=100)) == [(0, 64), (64, 100), (100, 128), (128, 150)]
    assert list(aligned_chunks(130, 10, 64, cut=100)) == [(0, 10)]  # a cut behind: none
    assert list(aligned_chunks(128, 64, 64, cut=192)) == [(0, 64)]  # a cut at the end: none


def test_a_restored_prompt_runs_the_windows_of_an_uninterrupted_one(model, monkeypatch, turn):
    """Every window of the resumed prefill ends where the uninterrupted run's do."""
    folder, first, reply, follow = turn
    engine = load(model, on_disk(folder))
    windows = []
    real = engine.model.forward

    def spy(batch, ids, all_logits=False):
        windows.append((batch.segments[0].start, batch.rows))
        return real(batch, ids, all_logits=all_logits)

    monkeypatch.setattr(engine.model, "forward", spy)
    stream = engine._open_stream()
    rest = engine._resume(stream, follow)
    engine.prefill(stream, rest)
    assert windows == [(159, 33), (192, 38)]  # restored at 159, then 192 = 3 * 64
    engine.unload()


def test_resumed_from_disk_by_a_new_engine_is_the_uninterrupted_run(model, turn):
    """A new engine (a new store over the same folder) restores the longest saved state;
    the logits of the rest of the prompt are those of the stream that went on, bit for bit,
    and the reply is the one a fresh prefill of the whole history gives."""
    folder, first, reply, follow = turn
    want = uninterrupted(model, first, reply, follow)
    engine = load(model, on_disk(folder))
    assert engine.prompt_cache.where(follow) == ("disk", tuple(first + reply[:-1]))
    stream = engine._open_stream()
    rest = engine._resume(stream, follow)
    got = engine.prefill(stream, rest, all_logits=True)
    engine._close_stream(stream)
    assert engine.prompt_cache.stats.hits["disk"] == 1
    assert np.array_equal(got, want)  # exact: the same state, the same windows
    # Against a fresh prefill of the whole history the windows differ where the state was
    # taken (a reply is fed in steps): fp32 rounding only (measured: ~3e-6 of the largest).
    fresh_engine = load(model)
    fresh = fresh_engine.prefill(fresh_engine._open_stream(), follow, all_logits=True)
    fresh = fresh[len(follow) - len(rest) :]
    assert np.abs(got - fresh).max() <= 1e-5 * np.abs(fresh).max()
    assert (got.argmax(-1) == fresh.argmax(-1)).all()
    assert tokens(engine, follow) == tokens(load(model), follow)
    engine.unload()


def test_a_state_saved_at_a_multiple_of_max_rows_resumes_as_a_fresh_prefill(model, tmp_path):
    """Where the saved state ends on a window boundary (128 = 2 * 64), the resumed prefill
    runs exactly the windows of a fresh prefill of the whole prompt: equal bit for bit."""
    first = prompt(128, seed=12)
    engine = load(model, on_disk(tmp_path))
    tokens(engine, first)
    engine.unload()
    follow = first + prompt(90, seed=13)
    engine = load(model, on_disk(tmp_path))
    stream = engine._open_stream()
    rest = engine._resume(stream, follow)
    assert len(stream.ids) == 128 and engine.prompt_cache.stats.hits["disk"] == 1
    got = engine.prefill(stream, rest, all_logits=True)
    fresh_engine = load(model)
    fresh = fresh_engine.prefill(fresh_engine._open_stream(), follow, all_logits=True)
    assert np.array_equal(got, fresh[128:])
    engine._close_stream(stream)
    engine.unload()


SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, sys
    import numpy as np
    from engine.config import EngineSettings
    from engine.session import Engine, GenerationParams

    model, folder, ids_path, out = sys.argv[1:5]
    follow = json.loads(open(ids_path).read())
    settings = dataclasses.replace(EngineSettings(backend="numpy"), prompt_cache_dir=folder)
    engine = Engine.load(model, settings, context=512, max_rows=64)
    where = engine.prompt_cache.where(follow)
    stream = engine._open_stream()
    rest = engine._resume(stream, follow)
    np.save(out, engine.prefill(stream, rest, all_logits=True))
    engine._close_stream(stream)
    params = GenerationParams(max_new_tokens=10, greedy=True)
    reply = [e.token_id for e in engine.generate(follow, params)]
    print(json.dumps({"where": where[0], "restored": len(where[1]), "reply": reply}))
    """
)


def test_resumed_from_disk_in_a_new_process_is_the_uninterrupted_run(model, turn, tmp_path):
    """The engine restarted for real: another Python process reads the folder."""
    folder, first, reply, follow = turn
    ids_path, out = tmp_path / "follow.json", tmp_path / "logits.npy"
    ids_path.write_text(json.dumps(follow))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model), str(folder), str(ids_path), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["where"] == "disk" and result["restored"] == len(first) + len(reply) - 1
    assert np.array_equal(np.load(out), uninterrupted(model, first, reply, follow))
    assert result["reply"] == tokens(load(model), follow)


def test_a_chat_resumes_from_where_its_last_turn_began(model, tmp_path):
    """A chat prompt is rendered again with the reply as the template writes it, not as it
    was generated: the state saved where the prompt's last turn began (its last
    <|im_start|>) is what the next prompt extends, from disk after a restart."""
    engine = load(model, on_disk(tmp_path))
    history = [{"role": "user", "content": "hello there"}]
    ids = engine.chat_ids(history)
    start = engine.turn_start(ids)
    assert start is not None and ids[start:][:1] == [engine.tokenizer.token_to_id("<|im_start|>")]
    reply = engine.tokenizer.decode(tokens(engine, ids), skip_special_tokens=True)
    engine.unload()
    history += [{"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    engine = load(model, on_disk(tmp_path))
    follow = engine.chat_ids(history)
    assert engine.prompt_cache.where(follow) == ("disk", tuple(ids[:start]))
    assert tokens(engine, follow) == tokens(load(model), follow)
    assert engine.prompt_cache.stats.hits["disk"] == 1
    engine.unload()


def test_a_snapshot_too_large_for_the_device_tier_goes_to_the_host_tier(model, monkeypatch):
    monkeypatch.setattr(session, "HOST_PROMPT_CACHE_BYTES", 0)
    engine = load(model)
    first = prompt(40, seed=7)
    reply = tokens(engine, first)
    cache = engine.prompt_cache
    assert len(cache.device) == 0 and len(cache.host) == 2  # the prompt's end, the reply's
    follow = first + reply + prompt(9, seed=8)
    assert cache.where(follow) == ("host", tuple(first + reply[:-1]))
    assert tokens(engine, follow) == tokens(load(model), follow)
    assert cache.stats.hits["host"] == 1


def test_a_state_too_large_for_the_host_tier_is_not_copied_there(model, monkeypatch):
    """No device tier, a host tier smaller than a state, no disk: the save makes no host
    copy (on a GPU, pinned memory) only to drop it; the reply is the same."""
    monkeypatch.setattr(session, "HOST_PROMPT_CACHE_BYTES", 0)
    engine = load(model, dataclasses.replace(NUMPY, prompt_cache_host_bytes=4096))
    backend = engine.prompt_cache.backend
    monkeypatch.setattr(backend, "snapshot_bytes", lambda length: 8192)
    copies = []
    real = backend.save_slot_to_host
    monkeypatch.setattr(backend, "save_slot_to_host", lambda *a: copies.append(a) or real(*a))
    first = prompt(40, seed=7)
    assert tokens(engine, first) == tokens(load(model), first)
    assert copies == [] and len(engine.prompt_cache) == 0
    engine.prompt_cache.host.budget_bytes = 1 << 30  # a tier the state fits
    tokens(engine, first + prompt(5, seed=8))
    assert copies and len(engine.prompt_cache.host) > 0


def _room_for_one(model, monkeypatch, tmp_path):
    """An engine whose "device" tier holds one saved state (with a disk tier in tmp_path),
    after a first turn: (engine, its prompt, its reply)."""
    probe = load(model)
    first = prompt(40, seed=9)
    reply = tokens(probe, first)
    one = probe.prompt_cache.device.lookup(first + reply).nbytes
    monkeypatch.setattr(session, "HOST_PROMPT_CACHE_BYTES", one + one // 10)
    engine = load(model, on_disk(tmp_path))
    assert tokens(engine, first) == reply
    return engine, first, reply


def test_a_snapshot_evicted_from_the_device_tier_moves_down(model, monkeypatch, tmp_path):
    """Room for one state on the "device": the prompt's end moves to the host tier when the
    reply's end is saved, and is restored from there, the same as fresh."""
    engine, first, reply = _room_for_one(model, monkeypatch, tmp_path)
    cache = engine.prompt_cache
    assert list(cache.device._entries) == [tuple(first + reply[:-1])]
    assert list(cache.host._entries) == [tuple(first)] and cache.stats.moved_down == 1
    cache.flush()
    assert len(cache.disk.store) == 2  # both written when taken
    other = first + prompt(5, seed=10)
    assert cache.where(other) == ("host", tuple(first))
    assert tokens(engine, other) == tokens(load(model), other)
    engine.unload()


def test_a_move_down_inside_a_reply_waits_for_nothing_until_the_reply_ends(
    model, monkeypatch, tmp_path
):
    """A save inside a reply that evicts a device snapshot queues its copy to the host
    (`wait=False`) and holds its disk copy back; the copies are waited for once, at the
    request's end, before the writer reads them; the spare is readied again there."""
    engine, first, reply = _room_for_one(model, monkeypatch, tmp_path)
    calls: list[tuple[str, object]] = []
    backend = engine.backend
    to_host = backend.snapshot_to_host
    monkeypatch.setattr(
        backend, "snapshot_to_host", lambda s, wait=True: calls.append(("copy", wait)) or to_host(s)
    )
    monkeypatch.setattr(backend, "settle_host_copies", lambda: calls.append(("settle", None)))
    moves: list[list] = []

    def ready(restores: bool, moves_next=()) -> None:
        calls.append(("ready", restores))
        moves.append(list(moves_next))

    monkeypatch.setattr(
        backend, "ready_host_copy", lambda restores, moves=(): ready(restores, moves)
    )
    cache = engine.prompt_cache
    cache.flush()
    written = len(cache.disk.store)
    other = first + prompt(5, seed=10)
    events = engine.generate(other, GREEDY)
    next(events)  # the first token; the prompt's state is saved after it is yielded
    next(events)
    assert ("copy", False) in calls and ("settle", None) not in calls
    assert tuple(first + reply[:-1]) in cache.host  # moved down (the copy only queued)
    rest = [e.token_id for e in events]
    assert len(rest) == GREEDY.max_new_tokens - 2
    settle = calls.index(("settle", None))
    assert calls.index(("copy", False)) < settle and calls[-1] == ("ready", True)
    # Readied for the next reply: a buffer for the device snapshot its first save would
    # move down (the only one the tier holds), none for one the host tier has already.
    (entry,) = cache.device.victims(cache.device.newest().nbytes, 2)
    assert entry.ids not in cache.host and moves[-1] == [entry.snapshot]
    # Where the backend knows a save's size, the next turn's (its ids and a message more)
    # counts: one too large for the tier moves nothing down, so nothing is readied.
    sizes: list[int] = []
    budget = cache.device.budget_bytes
    monkeypatch.setattr(backend, "snapshot_bytes", lambda n: sizes.append(n) or budget + 1)
    cache.ready_next()
    assert moves[-1] == [] and sizes == [len(entry.ids) + prompt_cache.NEXT_TURN_TOKENS]
    cache.flush()
    assert len(cache.disk.store) > written  # the moved state's disk copy, after the wait
    engine.unload()


def test_in_a_chat_every_state_moved_inside_a_reply_had_its_buffer_readied(model, monkeypatch):
    """Five turns of a chat through its template, the "device" tier filling up on the way:
    every snapshot moved down inside a reply (the turn start's and the first token's saves)
    is one the request before named to `ready_host_copy`, so on CUDA its copy takes a
    readied buffer. The backend gives each save's size ahead, as the CUDA one does."""
    probe = Engine.load(model, NUMPY, context=2048, max_rows=64)
    be = probe.backend
    fixed = be.snapshot_nbytes(be.save_slot(0, 0))
    per_token = be.snapshot_nbytes(be.save_slot(0, 1)) - fixed
    probe.unload()
    monkeypatch.setattr(session, "HOST_PROMPT_CACHE_BYTES", 3 * (fixed + 400 * per_token))
    engine = Engine.load(model, NUMPY, context=2048, max_rows=64)
    backend, cache = engine.backend, engine.prompt_cache
    monkeypatch.setattr(backend, "snapshot_bytes", lambda n: fixed + n * per_token)
    readied: list[list] = [[]]
    monkeypatch.setattr(
        backend, "ready_host_copy", lambda restores=False, moves=(): readied.append(list(moves))
    )
    to_host = backend.snapshot_to_host
    in_reply: list[bool] = []

    def move(snapshot, wait=True):
        if not wait:  # queued inside a reply
            in_reply.append(any(snapshot is s for s in readied[-1]))
        return to_host(snapshot)

    monkeypatch.setattr(backend, "snapshot_to_host", move)
    messages: list[dict[str, str]] = []
    for turn in range(5):
        messages.append({"role": "user", "content": f"question {turn}, and a longer one " * 4})
        events = list(engine.generate(engine.chat_ids(messages), GREEDY))
        messages.append({"role": "assistant", "content": "".join(e.text for e in events)})
    assert len(in_reply) >= 2 and all(in_reply)  # moves happened, each readied
    assert cache.stats.moved_down >= len(in_reply) and cache.stats.hits["device"] >= 3
    engine.unload()


def test_a_reply_whose_end_of_request_work_fails_still_gives_its_slot_back(model, monkeypatch):
    """The save, the deferred disk copies and the buffers for the next reply run after the
    last token; one that raises reaches the caller, and the slot is free all the same."""
    engine = load(model)
    cache = engine.prompt_cache
    free = list(engine._free_slots)

    def broken() -> None:
        raise RuntimeError("pinning went wrong")

    monkeypatch.setattr(cache, "ready_next", broken)
    with pytest.raises(RuntimeError, match="pinning went wrong"):
        list(engine.generate(prompt(12, seed=3), GREEDY))
    assert engine._free_slots == free
    monkeypatch.undo()
    assert len(tokens(engine, prompt(12, seed=4))) == GREEDY.max_new_tokens
    engine.unload()


def test_a_write_skipped_while_the_writer_was_busy_happens_when_the_host_tier_evicts(
    model, monkeypatch, tmp_path
):
    from engine.snapshot_writer import DiskWriter

    monkeypatch.setattr(session, "HOST_PROMPT_CACHE_BYTES", 0)
    real, calls = DiskWriter.submit, []

    def busy_once(self, ids, snapshot):
        calls.append(ids)
        return False if len(calls) == 1 else real(self, ids, snapshot)

    monkeypatch.setattr(DiskWriter, "submit", busy_once)
    engine = load(model, on_disk(tmp_path, prompt_cache_host_bytes=1))
    cache = engine.prompt_cache
    cache.host.budget_bytes = 10**9
    first = prompt(30, seed=11)
    stream = engine._open_stream()
    engine.prefill(stream, first)
    engine._save(stream)  # the writer is "busy": kept in the host tier only
    cache.flush()
    assert tuple(first) in cache.host and not cache.disk.store.contains(first)
    cache.host.make_room(cache.host.budget_bytes)  # evicts it: down to the disk
    cache.flush()
    assert cache.disk.store.contains(first) and calls == [tuple(first), tuple(first)]
    engine._close_stream(stream)
    engine.unload()


def test_the_scheduler_restores_a_conversation_from_disk(model, turn):
    """A request to the server that extends a saved conversation is served from the disk
    tier, with the windows `Engine.prefill` runs and the tokens of a fresh prefill."""
    folder, first, reply, follow = turn
    engine = load(model, on_disk(folder))
    scheduler = Scheduler(engine)
    request = scheduler.submit(follow, GREEDY)
    for _ in range(1000):
        if request.done.is_set():
            break
        scheduler.run_once()
    events = []
    while not request._queue.empty():
        events.append(request._queue.get())
    got = [e.token_id for e in events if e.token_id != NO_TOKEN]
    assert engine.prompt_cache.stats.hits["disk"] == 1
    assert scheduler.stats.prefill_chunks == 2  # 159 -> 192 -> 230
    assert got == tokens(load(model), follow)
    engine.unload()


def test_a_restore_from_disk_reads_into_the_backends_host_buffer(
    model, turn, monkeypatch, tmp_path
):
    """Where the backend lends a host buffer (CUDA: its spare pinned one), the saved file
    is read into it, and it goes back once the slot holds the state: the host tier keeps
    no view of it (the state stays on disk). The stats split the restore's time."""
    folder, first, reply, follow = turn
    shutil.copytree(folder, tmp_path / "c")  # the module's folder stays as it was
    engine = load(model, on_disk(tmp_path / "c"))
    asked, given, back = [], [], []

    def host_buffer(nbytes: int) -> np.ndarray:
        asked.append(nbytes)
        given.append(np.zeros(2 * nbytes, np.uint8))  # a spare larger than the file
        return given[-1]

    monkeypatch.setattr(engine.backend, "host_buffer", host_buffer)
    monkeypatch.setattr(engine.backend, "return_host_buffer", back.append)
    assert tokens(engine, follow) == tokens(load(model), follow)
    cache, ids = engine.prompt_cache, tuple(first + reply[:-1])
    data = tmp_path / "c" / f"{entry_name(cache.disk.store.key, ids)}.safetensors"
    assert asked == [data.stat().st_size] and cache.stats.hits["disk"] == 1
    assert len(back) == 1 and back[0] is given[0]
    assert ids not in cache.host and all(
        not np.shares_memory(a, given[0])
        for key in list(cache.host._entries)
        for a in cache.host.get(key).snapshot.arrays.values()
    )
    timing = cache.stats.last_restore
    assert (timing.tier, timing.tokens) == ("disk", len(ids))
    assert timing.read_s > 0 and timing.slot_s > 0
    engine.unload()
