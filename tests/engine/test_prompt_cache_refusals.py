"""The disk tier never gives a wrong answer: a corrupt or truncated file, a cache from
another model or engine version or of an older format, a state that does not fit the
backend and a full disk each end in a logged refusal and a fresh prefill, through the
Engine. Also: the writer thread never frees a snapshot, the settings and `snug cache`."""

from __future__ import annotations

import dataclasses
import errno
import gc
import json
import logging
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
import xxhash

import engine
from engine import snapshot_store
from engine.config import GIB, EngineSettings, default_data_dir, default_prompt_cache_dir
from engine.errors import ConfigError
from engine.session import Engine, GenerationParams
from engine.snapshot_store import (
    HostSnapshot,
    SnapshotMismatch,
    SnapshotStore,
    StoreKey,
    model_fingerprint,
)
from engine.snapshot_writer import DiskWriter

NUMPY = EngineSettings(backend="numpy")
GREEDY = GenerationParams(max_new_tokens=8, greedy=True)


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, size=length).tolist()


def load(model: Path, folder: Path | None = None) -> Engine:
    settings = NUMPY if folder is None else dataclasses.replace(NUMPY, prompt_cache_dir=str(folder))
    return Engine.load(model, settings, context=512, max_rows=64)


def tokens(eng: Engine, ids: list[int]) -> list[int]:
    return [e.token_id for e in eng.generate(ids, GREEDY)]


@pytest.fixture(scope="module")
def models(tiny_checkpoint) -> tuple[Path, Path]:
    return tiny_checkpoint("tied-l4-r1", "hf-fp32"), tiny_checkpoint("untied-l8-r2", "hf-fp32")


def _damage(folder: Path, how: str) -> None:
    if how == "old format":  # an index of format 2: one checksum of the whole file
        for meta in folder.glob("*.json"):
            info = json.loads(meta.read_text())
            data = meta.with_suffix(".safetensors")
            info.update(format=2, xxh3_128=xxhash.xxh3_128_hexdigest(data.read_bytes()))
            del info["block_bytes"]
            meta.write_text(json.dumps(info))
        return
    for data in folder.glob("*.safetensors"):
        raw = bytearray(data.read_bytes())
        if how == "corrupt":
            raw[len(raw) // 2] ^= 0xFF
            data.write_bytes(bytes(raw))
        else:
            data.write_bytes(bytes(raw[: len(raw) // 3]))


def _wrong_shapes(model: Path, folder: Path, ids: list[int]) -> None:
    """An entry that checks out on disk (this model, engine, precision, a good checksum)
    but whose arrays are not this backend's state: the backend must refuse it."""
    probe = load(model)
    stream = probe._open_stream()
    probe.prefill(stream, ids)
    host = probe.backend.snapshot_to_host(probe.backend.save_slot(stream.slot, len(ids)))
    arrays = dict(host.arrays)
    arrays["kv_k.0"] = np.concatenate([arrays["kv_k.0"]] * 2)  # twice the KV heads
    from engine.checkpoint import Checkpoint

    key = StoreKey(
        model_fingerprint(model, Checkpoint.open(model).tensors),
        engine.__version__,
        probe.backend.precision,
    )
    store = SnapshotStore(folder, key, GIB)
    store.clear()  # the good ones go: only the bad one is left to find
    assert store.save(ids, HostSnapshot(len(ids), arrays))


CASES = {
    "corrupt": "checksum",
    "truncate": "checksum",
    "old format": f"saved for format '2' (this is {snapshot_store.FORMAT})",
    "engine": "saved for engine '0.0.1'",
    "model": "saved for another model",
    "full disk": "could not save",
    "wrong shapes": "snapshot array kv_k.0",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_saved_state_that_does_not_check_out_gives_a_fresh_prefill(
    case, models, tmp_path, monkeypatch, caplog
):
    first_model, other_model = models
    model = other_model if case == "model" else first_model
    first = prompt(70, seed=1)
    caplog.set_level(logging.INFO)
    with monkeypatch.context() as m:  # the writing engine's (engine version, full disk)
        if case == "engine":
            m.setattr(engine, "__version__", "0.0.1")
        if case == "full disk":
            import safetensors.numpy

            def full(*_a, **_k):
                raise OSError(errno.ENOSPC, "No space left on device")

            m.setattr(safetensors.numpy, "save_file", full)
        writer = load(first_model, tmp_path)
        reply = tokens(writer, first)
        writer.unload()
    follow = first + reply + prompt(20, seed=2)
    if case in ("corrupt", "truncate", "old format"):
        _damage(tmp_path, case)
    if case == "wrong shapes":
        _wrong_shapes(model, tmp_path, first + reply[:-1])
    resumed = load(model, tmp_path)
    got = tokens(resumed, follow)
    assert CASES[case] in caplog.text
    assert got == tokens(load(model), follow)  # what a fresh prefill gives
    stats = resumed.prompt_cache.stats
    assert stats.hits["disk"] == 0 and stats.misses == 1
    resumed.unload()


def test_the_writer_thread_never_drops_the_last_reference(tmp_path):
    """Freeing a pinned buffer is CuPy's business on the engine thread: the writer hands
    every snapshot back, and the engine thread lets it go (`reap`)."""
    store = SnapshotStore(tmp_path, StoreKey("m" * 64, "0", "numpy:float32"), GIB)
    writer = DiskWriter(store, depth=8)
    freed_on: list[str] = []
    for i in range(6):
        array = np.full((4, 16), i, np.float32)
        weakref.finalize(array, lambda: freed_on.append(threading.current_thread().name))
        assert writer.submit((i, i + 1), HostSnapshot(2, {"kv_k.0": array}))
        del array
    writer.flush()
    gc.collect()
    writer.close()
    assert len(freed_on) == 6 and set(freed_on) == {threading.main_thread().name}
    assert len(store) == 6


def test_a_host_snapshot_of_another_layout_is_refused_by_the_backend(models):
    eng = load(models[0])
    stream = eng._open_stream()
    eng.prefill(stream, prompt(10, seed=3))
    host = eng.backend.snapshot_to_host(eng.backend.save_slot(stream.slot, 10))
    eng.backend.restore_slot(stream.slot, host)  # its own: fine
    for bad in (
        HostSnapshot(10, {k: v.astype(np.float64) for k, v in host.arrays.items()}),
        HostSnapshot(10, {k: v for k, v in host.arrays.items() if k != "conv.0"}),
        HostSnapshot(600, host.arrays),  # longer than the context
    ):
        with pytest.raises(SnapshotMismatch):
            eng.backend.restore_slot(stream.slot, bad)


def test_settings_from_the_environment():
    env = {
        "SNUG_PROMPT_CACHE_DIR": "/tmp/x",
        "SNUG_PROMPT_CACHE_HOST_GIB": "0.5",
        "SNUG_PROMPT_CACHE_DISK_GIB": "0",
    }
    s = EngineSettings.from_env(env)
    assert (s.prompt_cache_dir, s.prompt_cache_host_bytes) == ("/tmp/x", GIB // 2)
    assert s.prompt_cache_disk_bytes == 0
    default = EngineSettings()
    assert default.prompt_cache_dir is None  # no disk tier unless a folder is given
    assert (default.prompt_cache_host_bytes, default.prompt_cache_disk_bytes) == (2 * GIB, 8 * GIB)
    with pytest.raises(ConfigError, match="SNUG_PROMPT_CACHE_HOST_GIB"):
        EngineSettings.from_env({"SNUG_PROMPT_CACHE_HOST_GIB": "-1"})
    assert default_prompt_cache_dir(env) == Path("/tmp/x")


@pytest.mark.parametrize(
    "platform, env, want",
    [
        ("linux", {"HOME": "/h"}, "/h/.local/share/Snug/Snug"),
        ("linux", {"HOME": "/h", "XDG_DATA_HOME": "/d"}, "/d/Snug/Snug"),
        ("linux", {"HOME": "/h", "XDG_DATA_HOME": "rel"}, "/h/.local/share/Snug/Snug"),
        ("darwin", {"HOME": "/h"}, "/h/Library/Application Support/Snug/Snug"),
        ("win32", {"HOME": "/h", "APPDATA": "/r"}, "/r/Snug/Snug"),
    ],
)
def test_the_data_folder_is_where_qt_puts_the_apps_data(platform, env, want):
    assert default_data_dir(env, platform) == Path(want)


def test_no_disk_tier_when_its_budget_is_zero(models, tmp_path):
    settings = dataclasses.replace(
        NUMPY, prompt_cache_dir=str(tmp_path / "c"), prompt_cache_disk_bytes=0
    )
    eng = Engine.load(models[0], settings, context=256, max_rows=64)
    assert eng.prompt_cache.disk is None and not (tmp_path / "c").exists()


def test_snug_cache_clear(models, tmp_path, capsys):
    from engine.cli import main

    one, two = models
    for model in models:
        eng = load(model, tmp_path)
        tokens(eng, prompt(30, seed=4))
        eng.unload()
    count = len(list(tmp_path.glob("*.json")))
    assert count >= 4
    assert main(["cache", "info", "--dir", str(tmp_path)]) == 0
    assert f"{count} saved prompt states" in capsys.readouterr().out
    assert main(["cache", "clear", "--dir", str(tmp_path), "--model", str(one)]) == 0
    left = len(list(tmp_path.glob("*.json")))
    assert 0 < left < count and "removed" in capsys.readouterr().out
    eng = load(two, tmp_path)
    assert len(eng.prompt_cache.disk.store) == left  # the other model's are kept
    eng.unload()
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == [snapshot_store.LOCK_NAME]
