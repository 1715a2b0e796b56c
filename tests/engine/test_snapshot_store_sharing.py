"""The disk tier's folder as a desktop user has it: shared by two engines at once (two app
windows, the app and `snug serve`), cleared by `snug cache clear` while an engine runs, on
a full or read-only disk, removed by hand, holding an older format's entries, or next to a
model whose weights changed. Each case ends with the engine serving (a fresh prefill where
a state cannot be had), a logged reason, and the folder within its budget."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engine import snapshot_store
from engine.config import EngineSettings
from engine.session import Engine, GenerationParams
from engine.snapshot_folder import clear_folder
from engine.snapshot_store import SnapshotStore, entry_name, model_fingerprint
from tests.engine.test_snapshot_store import KEY, _snapshot, listing

GREEDY = GenerationParams(max_new_tokens=6, greedy=True)


def _save_held(store: SnapshotStore, monkeypatch):
    """A save of 40 tokens on a thread of its own, held after its data file is written
    (its JSON not yet renamed in) until `go_on` is set: (thread, [its result], go_on)."""
    import safetensors.numpy

    real, writing, go_on = safetensors.numpy.save_file, threading.Event(), threading.Event()

    def slow(arrays, path):
        real(arrays, path)
        writing.set()
        go_on.wait(5)

    monkeypatch.setattr(safetensors.numpy, "save_file", slow)
    saved: list[bool] = []
    thread = threading.Thread(target=lambda: saved.append(store.save(_ids(0), _snapshot(40))))
    thread.start()
    assert writing.wait(5)
    return thread, saved, go_on


def _ids(start: int, n: int = 40) -> list[int]:
    return list(range(start, start + n))


def _load(model: Path, folder: Path | None = None) -> Engine:
    settings = EngineSettings(backend="numpy")
    if folder is not None:
        settings = dataclasses.replace(settings, prompt_cache_dir=str(folder))
    return Engine.load(model, settings, context=512, max_rows=64)


def _tokens(eng: Engine, ids: list[int]) -> list[int]:
    return [e.token_id for e in eng.generate(ids, GREEDY)]


def _prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, size=length).tolist()


@pytest.fixture(scope="module")
def model(tiny_checkpoint) -> Path:
    return tiny_checkpoint("tied-l4-r1", "hf-fp32")


# ----- two stores on one folder ------------------------------------------------------------
def test_two_stores_on_one_folder_stay_within_its_budget_together(tmp_path):
    one = _snapshot(40).nbytes
    budget = 2 * one + one // 2
    a, b = SnapshotStore(tmp_path, KEY, budget), SnapshotStore(tmp_path, KEY, budget)
    for i in range(8):
        assert (a if i % 2 else b).save(_ids(100 * i), _snapshot(40, i))
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("*.safetensors"))
    assert on_disk <= budget + one // 10  # the headers past the arrays' bytes
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_state_another_store_saved_is_found(tmp_path):
    a, b = SnapshotStore(tmp_path, KEY, 1 << 30), SnapshotStore(tmp_path, KEY, 1 << 30)
    assert a.save(_ids(0), _snapshot(40))
    assert b.lookup(_ids(0, 41)) == tuple(_ids(0))
    back = b.load(tuple(_ids(0)))
    assert np.array_equal(back.arrays["kv_k.0"], _snapshot(40).arrays["kv_k.0"])


def test_a_state_another_store_evicted_is_neither_restored_nor_taken_for_saved(tmp_path):
    a, b = SnapshotStore(tmp_path, KEY, 1 << 30), SnapshotStore(tmp_path, KEY, 1 << 30)
    assert a.save(_ids(0), _snapshot(40))
    b.lookup(_ids(0, 41))  # b knows it
    a.remove(entry_name(KEY, _ids(0)))
    assert not b.contains(_ids(0)) and b.lookup(_ids(0, 41)) is None
    assert b.save(_ids(0), _snapshot(40))  # written again, not skipped as saved
    assert a.lookup(_ids(0, 41)) == tuple(_ids(0))


def test_a_store_opened_while_another_saves_leaves_that_save_alone(tmp_path, monkeypatch):
    """A new engine's start removes what interrupted saves left, never the temporary files of
    a save in flight in another engine (nor its data before its JSON is renamed in)."""
    writer = SnapshotStore(tmp_path, KEY, 1 << 30)
    thread, saved, go_on = _save_held(writer, monkeypatch)
    opened: list[SnapshotStore] = []
    starter = threading.Thread(target=lambda: opened.append(SnapshotStore(tmp_path, KEY, 1 << 30)))
    starter.start()
    time.sleep(0.3)  # the new store waits for the save in flight
    go_on.set()
    thread.join(10)
    starter.join(10)
    assert saved == [True]
    assert opened[0].lookup(_ids(0, 41)) == tuple(_ids(0))
    assert opened[0].load(tuple(_ids(0))) is not None


def test_snug_cache_clear_during_a_save_waits_for_it_and_never_fails(tmp_path, monkeypatch):
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    thread, saved, go_on = _save_held(store, monkeypatch)
    threading.Timer(0.3, go_on.set).start()
    assert clear_folder(tmp_path)[0] == 1  # the save finished first, and went
    thread.join(10)
    assert saved == [True] and listing(tmp_path) == []


# ----- the folder changed under a running engine -------------------------------------------
def test_a_state_removed_by_snug_cache_clear_is_saved_again(tmp_path):
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    assert store.save(_ids(0), _snapshot(40))
    assert clear_folder(tmp_path)[0] == 1
    assert not store.contains(_ids(0))
    assert store.save(_ids(0), _snapshot(40))
    assert SnapshotStore(tmp_path, KEY, 1 << 30).lookup(_ids(0, 41)) == tuple(_ids(0))


def test_an_engine_saves_again_what_snug_cache_clear_removed_under_it(model, tmp_path, caplog):
    """The states the engine still holds in memory were taken for saved on the disk: the
    same prompt sent again (Regenerate) writes them again."""
    from engine.cli import main

    first = _prompt(70, seed=1)
    eng = _load(model, tmp_path)
    reply = _tokens(eng, first)
    eng.prompt_cache.flush()
    assert main(["cache", "clear", "--dir", str(tmp_path)]) == 0
    caplog.set_level(logging.WARNING)
    assert _tokens(eng, first) == reply  # restored from memory
    eng.unload()
    assert "refusing" not in caplog.text
    resumed = _load(model, tmp_path)
    follow = first + reply + _prompt(20, seed=2)
    assert _tokens(resumed, follow) == _tokens(_load(model), follow)
    assert resumed.prompt_cache.stats.hits["disk"] == 1
    resumed.unload()


def test_a_folder_removed_by_hand_is_made_again_at_the_next_save(tmp_path):
    folder = tmp_path / "cache"
    store = SnapshotStore(folder, KEY, 1 << 30)
    assert store.save(_ids(0), _snapshot(40))
    shutil.rmtree(folder)
    assert store.save(_ids(100), _snapshot(40))
    assert SnapshotStore(folder, KEY, 1 << 30).lookup(_ids(100, 41)) == tuple(_ids(100))


# ----- the disk fails ----------------------------------------------------------------------
def test_a_full_disk_while_the_index_is_written_leaves_no_temporary_file(
    tmp_path, monkeypatch, caplog
):
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    assert store.save(_ids(0), _snapshot(40))

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", full)
    with caplog.at_level(logging.WARNING):
        assert not store.save(_ids(100), _snapshot(40))
    assert "could not save" in caplog.text
    assert [n for n in listing(tmp_path) if n.endswith(".tmp")] == []


def test_a_full_disk_as_safetensors_reports_it_is_a_logged_refusal(tmp_path, monkeypatch, caplog):
    """safetensors raises its own SafetensorError for a write that fails (not OSError)."""
    import safetensors.numpy
    from safetensors import SafetensorError

    def full(*_a, **_k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device")

    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    with caplog.at_level(logging.WARNING):
        assert not store.save(_ids(0), _snapshot(40))
    assert "could not save" in caplog.text and "No space left" in caplog.text
    assert listing(tmp_path) == []


def test_a_file_that_cannot_be_removed_is_refused_and_not_restored_again(
    model, tmp_path, monkeypatch, caplog
):
    """A damaged entry in a folder where nothing can be removed (read-only, or a file held
    open on Windows): the restore is refused, the prompt prefilled afresh, the file named."""
    first = _prompt(70, seed=1)
    writer = _load(model, tmp_path)
    reply = _tokens(writer, first)
    writer.unload()
    for data in tmp_path.glob("*.safetensors"):
        data.write_bytes(data.read_bytes()[:100])  # truncated
    real = Path.unlink

    def read_only(self, missing_ok=False):
        if self.parent == tmp_path:
            raise PermissionError(errno.EROFS, "Read-only file system", str(self))
        real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", read_only)
    caplog.set_level(logging.WARNING)
    resumed = _load(model, tmp_path)
    follow = first + reply + _prompt(20, seed=2)
    assert _tokens(resumed, follow) == _tokens(_load(model), follow)
    assert "refusing saved state" in caplog.text and "could not remove" in caplog.text
    assert str(tmp_path) in caplog.text
    assert resumed.prompt_cache.stats.hits["disk"] == 0
    resumed.unload()


def test_an_index_rewritten_as_no_object_is_refused(tmp_path, caplog):
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    assert store.save(_ids(0), _snapshot(40))
    (tmp_path / f"{entry_name(KEY, _ids(0))}.json").write_text("[1, 2]")
    with caplog.at_level(logging.WARNING):
        assert store.load(tuple(_ids(0))) is None
    assert "refusing saved state" in caplog.text and listing(tmp_path) == []


# ----- what the folder holds ---------------------------------------------------------------
def test_an_older_formats_entry_for_the_same_ids_is_replaced(tmp_path):
    store = SnapshotStore(tmp_path, KEY, 1 << 30)
    assert store.save(_ids(0), _snapshot(40))
    meta = tmp_path / f"{entry_name(KEY, _ids(0))}.json"
    info = json.loads(meta.read_text())
    meta.write_text(json.dumps({**info, "format": snapshot_store.FORMAT - 1}))
    upgraded = SnapshotStore(tmp_path, KEY, 1 << 30)
    assert upgraded.lookup(_ids(0, 41)) is None and not upgraded.contains(_ids(0))
    assert upgraded.save(_ids(0), _snapshot(40))
    assert json.loads(meta.read_text())["format"] == snapshot_store.FORMAT
    assert SnapshotStore(tmp_path, KEY, 1 << 30).lookup(_ids(0, 41)) == tuple(_ids(0))


def test_a_budget_smaller_than_one_state_says_so_once(tmp_path, caplog):
    store = SnapshotStore(tmp_path, KEY, _snapshot(40).nbytes - 1)
    with caplog.at_level(logging.INFO):
        assert not store.save(_ids(0), _snapshot(40))
        assert not store.save(_ids(100), _snapshot(40))
    assert caplog.text.count("larger than the disk budget") == 1
    assert listing(tmp_path) == []


def test_a_folder_named_with_spaces_and_non_ascii_letters(model, tmp_path):
    folder = tmp_path / "Snug cache ü 日本"
    first = _prompt(70, seed=1)
    writer = _load(model, folder)
    reply = _tokens(writer, first)
    writer.unload()
    resumed = _load(model, folder)
    follow = first + reply + _prompt(20, seed=2)
    assert _tokens(resumed, follow) == _tokens(_load(model), follow)
    assert resumed.prompt_cache.stats.hits["disk"] == 1
    resumed.unload()


# ----- the model ---------------------------------------------------------------------------
def _copy_with_other_weights(model: Path, to: Path) -> Path:
    """The same config.json and shapes, other values (a fine-tune of the same model)."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(model, to)
    for path in to.glob("*.safetensors"):
        arrays = load_file(str(path))
        for name in arrays:
            if "layers.0." in name and arrays[name].ndim == 2:
                arrays[name] = arrays[name] * np.asarray(1.5, arrays[name].dtype)
        save_file(arrays, str(path), metadata={"format": "pt"})
    return to


def test_the_fingerprint_follows_the_weights_not_the_folders_name(model, tmp_path):
    from engine.checkpoint import Checkpoint

    def fingerprint(folder: Path) -> str:
        return model_fingerprint(folder, Checkpoint.open(folder).tensors)

    moved = tmp_path / "renamed model"
    shutil.copytree(model, moved)
    assert fingerprint(moved) == fingerprint(model)
    assert fingerprint(_copy_with_other_weights(model, tmp_path / "tuned")) != fingerprint(model)


def test_a_fine_tune_of_the_same_shape_restores_none_of_the_base_models_states(
    model, tmp_path, caplog
):
    tuned = _copy_with_other_weights(model, tmp_path / "tuned")
    first = _prompt(70, seed=1)
    base = _load(model, tmp_path / "cache")
    reply = _tokens(base, first)
    base.unload()
    caplog.set_level(logging.INFO)
    other = _load(tuned, tmp_path / "cache")
    follow = first + reply + _prompt(20, seed=2)
    assert _tokens(other, follow) == _tokens(_load(tuned), follow)
    assert other.prompt_cache.stats.hits["disk"] == 0
    assert "saved for another model" in caplog.text
    other.unload()


def test_snug_cache_info_while_an_engine_evicts(tmp_path, monkeypatch, capsys):
    """An entry listed, then removed by an engine using the folder before it is read."""
    from engine.cli import main

    SnapshotStore(tmp_path, KEY, 1 << 30).save(_ids(0), _snapshot(40))
    real = Path.glob

    def listed_then_evicted(self, pattern):
        found = list(real(self, pattern))
        return [*found, self / f"{'ab' * 16}.json"] if pattern == "*.json" else found

    monkeypatch.setattr(Path, "glob", listed_then_evicted)
    assert main(["cache", "info", "--dir", str(tmp_path)]) == 0
    assert "1 saved prompt states" in capsys.readouterr().out
