"""Downloads from a Hub that lies: paths in ETags, wrong hashes, short bodies, zero sizes, races.

Every test ends with the cache in order: each blob's hash matches its name and nothing was
written outside the cache folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from filelock import FileLock
from hf_server import FakeHub, content_etag, git_blob_sha1
from hypothesis import given, settings
from hypothesis import strategies as st

from app.controllers import DownloadManager
from app.workers.downloader import DISK_MARGIN
from app.workers.hub_files import RepoCache, UnsafeHubValue, content_hash, repo_name

REPO = "snug-test/hostile-0.8B"


def _files() -> dict[str, bytes]:
    return {
        "config.json": b'{"model_type": "qwen3_5"}',
        "tokenizer.json": b'{"model": {}}',
        "model.safetensors": os.urandom(3 << 20),
    }


@pytest.fixture
def attempt(hf_home, qtbot):
    """Runs one download on a fresh DownloadManager (as after a restart); returns the outcome."""
    managers = []

    def run(endpoint: str, timeout: int = 15000) -> tuple[str, tuple]:
        m = DownloadManager(cache_dir=str(hf_home), endpoint=endpoint)
        managers.append(m)
        got: list[tuple[str, tuple]] = []
        m.finished.connect(lambda *a: got.append(("finished", a)))
        m.failed.connect(lambda *a: got.append(("failed", a)))
        m.cancelled.connect(lambda *a: got.append(("cancelled", a)))
        assert m.download(REPO)
        qtbot.waitUntil(lambda: bool(got), timeout=timeout)
        return got[0]

    yield run
    for m in managers:
        m.shutdown()


def bad_blobs(cache: Path) -> list[str]:
    """Blobs whose content does not hash to their name (sha256 or git blob sha1)."""
    bad = []
    for blob in cache.rglob("blobs/*"):
        if blob.name.endswith(".incomplete"):
            continue
        data = blob.read_bytes()
        want = hashlib.sha256(data).hexdigest() if len(blob.name) == 64 else git_blob_sha1(data)
        if want != blob.name:
            bad.append(blob.name)
    return bad


def planted(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if "planted" in p.name]


def test_etag_with_dot_dots_is_refused_and_nothing_lands_outside_the_cache(
    attempt, hf_home, tmp_path
):
    with FakeHub({REPO: _files()}) as hub:
        hub.etags["config.json"] = "../../../../planted-by-etag"
        kind, args = attempt(hub.url)
    assert kind == "failed"
    message = args[1]
    assert REPO in message and "config.json" in message and "../../../../planted-by-etag" in message
    assert planted(tmp_path) == []
    assert bad_blobs(hf_home) == []


def test_absolute_path_etag_is_refused(attempt, hf_home, tmp_path):
    target = tmp_path / "outside" / "planted-absolute"
    target.parent.mkdir()
    with FakeHub({REPO: _files()}) as hub:
        hub.etags["model.safetensors"] = str(target)
        kind, args = attempt(hub.url)
    assert kind == "failed" and str(target) in args[1] and "model.safetensors" in args[1]
    assert planted(tmp_path) == []


def test_listing_name_with_dot_dots_is_refused(attempt, hf_home, tmp_path):
    with FakeHub({REPO: _files()}) as hub:
        hub.extra.append({"rfilename": "../../planted.json", "size": 2, "blobId": "0" * 40})
        kind, args = attempt(hub.url)
    assert kind == "failed" and "../../planted.json" in args[1]
    assert planted(tmp_path) == []


def test_commit_that_is_not_a_hash_is_refused(attempt, hf_home, tmp_path):
    with FakeHub({REPO: _files()}) as hub:
        hub.sha = "../../planted-commit"
        kind, args = attempt(hub.url)
    assert kind == "failed" and "../../planted-commit" in args[1]
    assert planted(tmp_path) == []


def test_corrupt_body_of_the_right_size_never_enters_the_cache_and_a_retry_repairs_it(
    attempt, hf_home
):
    files = _files()
    good = content_etag("model.safetensors", files["model.safetensors"])
    with FakeHub({REPO: files}) as hub:
        hub.corrupt_once.add("model.safetensors")
        kind, args = attempt(hub.url)
        assert kind == "failed"
        assert "model.safetensors" in args[1] and good in args[1]
        assert not list(hf_home.rglob(good)) and not list(hf_home.rglob("*.incomplete"))
        kind, args = attempt(hub.url)
    assert kind == "finished"
    folder = Path(args[1])
    assert (folder / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert bad_blobs(hf_home) == []


def test_a_damaged_blob_already_in_the_cache_is_replaced(attempt, hf_home):
    files = _files()
    blobs = hf_home / "models--snug-test--hostile-0.8B" / "blobs"
    blobs.mkdir(parents=True)
    name = content_etag("config.json", files["config.json"])
    (blobs / name).write_bytes(b'{"model_type": "qwen3_5", "x": 1}{"model_type": "qwen3_5"}')
    with FakeHub({REPO: files}) as hub:
        kind, args = attempt(hub.url)
    assert kind == "finished"
    assert (Path(args[1]) / "config.json").read_bytes() == files["config.json"]
    assert bad_blobs(hf_home) == []


def test_short_body_fails_then_a_retry_resumes_with_range(attempt, hf_home):
    files = _files()
    with FakeHub({REPO: files}) as hub:
        hub.short_once.add("model.safetensors")
        kind, args = attempt(hub.url)
        assert kind == "failed" and "model.safetensors" in args[1]
        assert [p.stat().st_size for p in hf_home.rglob("*.incomplete")] == [(3 << 20) // 2]
        kind, args = attempt(hub.url)
    assert kind == "finished"
    assert (Path(args[1]) / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert hub.ranges_for("model.safetensors")[-1] == f"bytes={(3 << 20) // 2}-"
    assert bad_blobs(hf_home) == [] and not list(hf_home.rglob("*.incomplete"))


def test_zero_size_listing_still_checks_the_disk_against_the_real_sizes(
    attempt, hf_home, monkeypatch
):
    files = _files()
    real_disk_usage = shutil.disk_usage
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(1 << 40, 0, DISK_MARGIN + 4096))
    with FakeHub({REPO: files}) as hub:
        hub.listed = {n: {"size": 0} for n in files}
        hub.listed["model.safetensors"]["lfs"] = {
            "sha256": content_etag("model.safetensors", files["model.safetensors"]),
            "size": 0,
            "pointerSize": 130,
        }
        kind, args = attempt(hub.url)
        assert kind == "failed" and "Not enough disk space" in args[1]
        assert not list(hf_home.rglob("*.safetensors*")) and not list(hf_home.rglob("blobs/*"))
        monkeypatch.setattr(shutil, "disk_usage", real_disk_usage)
        kind, args = attempt(hub.url)
    assert kind == "finished"
    assert (Path(args[1]) / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_two_downloads_of_one_repo_both_succeed_and_every_blob_matches_its_name(hf_home, qtbot):
    files = _files()
    with FakeHub({REPO: files}) as hub:
        hub.stall_s = 0.2  # both clients are inside the same file's GET at once
        managers = [DownloadManager(cache_dir=str(hf_home), endpoint=hub.url) for _ in range(2)]
        done: list[tuple] = []
        for m in managers:
            m.finished.connect(lambda *a: done.append(("finished", a)))
            m.failed.connect(lambda *a: done.append(("failed", a)))
        try:
            for m in managers:
                assert m.download(REPO)
            qtbot.waitUntil(lambda: len(done) == 2, timeout=20000)
        finally:
            for m in managers:
                m.shutdown()
    assert [kind for kind, _ in done] == ["finished", "finished"], done
    for _, (_, folder) in done:
        for name, data in files.items():
            assert (Path(folder) / name).read_bytes() == data
    assert bad_blobs(hf_home) == [] and not list(hf_home.rglob("*.incomplete"))


def test_a_download_waiting_for_the_repo_lock_can_be_cancelled(hf_home, qtbot):
    with FakeHub({REPO: _files()}) as hub:
        lock = FileLock(RepoCache(hf_home, REPO).lock_path)
        RepoCache(hf_home, REPO).lock_path.parent.mkdir(parents=True)
        m = DownloadManager(cache_dir=str(hf_home), endpoint=hub.url)
        try:
            with lock:
                with qtbot.waitSignal(m.cancelled, timeout=5000):
                    m.download(REPO)
                    qtbot.wait(300)
                    m.cancel()
        finally:
            m.shutdown()
    assert not list(hf_home.rglob("blobs/*"))


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/etc/passwd",
        "../x.json",
        "a/../../x.json",
        "a//b.json",
        "a\\..\\b.json",
        "./a.json",
        "C:x.json",
        "a/\x00.json",
        "a/",
    ],
)
def test_unsafe_file_names_are_refused_by_name(name):
    with pytest.raises(UnsafeHubValue, match="the file name"):
        repo_name(REPO, name)


@pytest.mark.parametrize(
    "value", [None, "", "../" * 3 + "x", "/abs", "A" * 40, "g" * 64, "0" * 39, "0" * 65, "0" * 50]
)
def test_unsafe_hashes_are_refused_naming_repo_file_and_value(value):
    with pytest.raises(UnsafeHubValue) as caught:
        content_hash(REPO, "config.json", value)
    assert REPO in str(caught.value) and "config.json" in str(caught.value)
    assert repr(value) in str(caught.value)


@settings(max_examples=300, database=None)
@given(st.text(min_size=1, max_size=60))
def test_every_accepted_name_stays_inside_the_snapshot(name):
    try:
        safe = repo_name(REPO, name)
    except UnsafeHubValue:
        return
    base = os.path.realpath("/snapshot")
    joined = os.path.realpath(os.path.join(base, *safe.split("/")))
    assert os.path.commonpath([base, joined]) == base and joined != base
