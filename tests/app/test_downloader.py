"""Downloads against a local stand-in for the Hub: progress, cut connection, resume, errors."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest
from hf_server import FakeHub

from app.controllers import DownloadManager
from app.state.catalog import Library, scan_cache
from app.workers.hub_files import BlobSink

REPO = "mlx-community/Qwen3.5-0.8B-MLX-4bit"
CATALOG_KEY = "qwen3.5-0.8b-4bit"


def _files() -> dict[str, bytes]:
    weights = os.urandom(3 << 20)
    return {
        "config.json": b'{"model_type": "qwen3_5"}',
        "tokenizer.json": b'{"model": {}}',
        "model.safetensors": weights,
        "README.md": b"# not downloaded",
    }


@pytest.fixture
def manager(hf_home, qtbot):
    managers = []

    def make(endpoint: str) -> DownloadManager:
        m = DownloadManager(cache_dir=str(hf_home), endpoint=endpoint)
        managers.append(m)
        return m

    yield make
    for m in managers:
        m.shutdown()


def test_cut_connection_resumes_with_range_and_correct_bytes(manager, qtbot):
    files = _files()
    with FakeHub({REPO: files}, cut_once={"model.safetensors"}) as hub:
        m = manager(hub.url)
        seen: list[tuple[int, int]] = []
        m.progress.connect(lambda _r, done, total, _s: seen.append((done, total)))
        with qtbot.waitSignal(m.finished, timeout=8000) as done:
            assert m.download(REPO)
    repo, folder = done.args
    assert repo == REPO
    got = open(os.path.join(folder, "model.safetensors"), "rb").read()
    assert got == files["model.safetensors"]
    ranges = hub.ranges_for("model.safetensors")
    assert ranges[0] is None and ranges[-1] and ranges[-1].startswith("bytes=")
    assert seen and seen[-1][1] == sum(len(b) for n, b in files.items() if n != "README.md")
    assert not os.path.exists(os.path.join(folder, "README.md"))


def test_cancel_then_restart_resumes_from_incomplete_file(manager, qtbot, hf_home):
    files = _files()
    with FakeHub({REPO: files}) as hub:
        hub.delay_s = 0.01
        m = manager(hub.url)
        m.progress.connect(lambda _r, done, _t, _s: done > (1 << 20) and m.cancel())
        with qtbot.waitSignal(m.cancelled, timeout=5000):
            m.download(REPO)
        partial = list(hf_home.rglob("*.incomplete"))
        assert partial and partial[0].stat().st_size > 0
        hub.delay_s = 0.0
        m2 = manager(hub.url)  # a fresh manager, as after a restart
        with qtbot.waitSignal(m2.finished, timeout=5000) as done:
            m2.download(REPO)
    folder = done.args[1]
    assert (
        open(os.path.join(folder, "model.safetensors"), "rb").read() == files["model.safetensors"]
    )
    ranges = [r for r in hub.ranges_for("model.safetensors") if r]
    assert ranges, "the second attempt must resume with a Range request"


def test_missing_repo_and_offline_give_clear_messages(manager, qtbot):
    with FakeHub({REPO: _files()}) as hub:
        m = manager(hub.url)
        with qtbot.waitSignal(m.failed, timeout=5000) as failed:
            m.download("nobody/none")
    assert "not found" in failed.args[1]
    m = manager("http://127.0.0.1:9")  # nothing listens there
    with qtbot.waitSignal(m.failed, timeout=5000) as failed:
        m.download(REPO)
    assert "Cannot reach the Hugging Face Hub" in failed.args[1]


def _safetensors(n: int) -> bytes:
    """A valid safetensors file of one U8 tensor of `n` random bytes."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    return len(header).to_bytes(8, "little") + header + os.urandom(n)


def _sharded() -> dict[str, bytes]:
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"weight_map": {"a": names[0], "b": names[1]}}
    return {
        "config.json": b'{"model_type": "qwen3_5"}',
        names[0]: _safetensors(1 << 20),
        names[1]: _safetensors(3 << 20),
        "model.safetensors.index.json": json.dumps(index).encode(),
        "tokenizer.json": b"{}",
    }


def _cached(hf_home) -> dict:
    return scan_cache(str(hf_home))[0]


def test_a_stalled_hub_is_cancelled_at_once_and_quitting_does_not_wait(manager, qtbot):
    with FakeHub({REPO: _files()}) as hub:
        hub.info_stall_s = 30  # the Hub takes the request and never answers
        m = manager(hub.url)
        m.download(REPO)
        qtbot.wait(300)
        with qtbot.waitSignal(m.cancelled, timeout=2000):
            m.cancel()
        assert m.active is None
        m.download(REPO)
        qtbot.wait(300)
        t0 = time.monotonic()
        assert m.shutdown(3000), "quitting mid-download must end the download thread"
        assert time.monotonic() - t0 < 2


def test_an_interrupted_download_is_never_listed_as_a_model(manager, qtbot, hf_home):
    files = _sharded()
    with FakeHub({REPO: files}) as hub:
        hub.delay_s = 0.01
        m = manager(hub.url)
        stop = [(1 << 20) + (1 << 19)]
        m.progress.connect(lambda _r, done, _t, _s: done > stop[0] and m.cancel())
        with qtbot.waitSignal(m.cancelled, timeout=8000):
            m.download(REPO)
        stop[0] = 1 << 40
        assert REPO not in _cached(hf_home) or _cached(hf_home)[REPO][3]
        entry = next(e for e in Library(str(hf_home)).entries() if e.repo == REPO)
        assert not entry.downloaded
        hub.delay_s = 0.0
        with qtbot.waitSignal(m.finished, timeout=8000) as done:
            m.download(REPO)
    for name, data in files.items():
        assert (Path(done.args[1]) / name).read_bytes() == data
    entry = next(e for e in Library(str(hf_home)).entries() if e.repo == REPO)
    assert entry.downloaded and entry.problem == ""


@pytest.mark.parametrize("damage", ["truncated", "deleted blob", "missing shard"])
def test_a_damaged_snapshot_is_not_offered_and_download_repairs_it(manager, qtbot, hf_home, damage):
    files = _sharded()
    shard = "model-00002-of-00002.safetensors"
    with FakeHub({REPO: files}) as hub:
        m = manager(hub.url)
        with qtbot.waitSignal(m.finished, timeout=8000) as done:
            m.download(REPO)
        snap = Path(done.args[1])
        blob = (snap / shard).resolve()
        if damage == "truncated":
            os.truncate(blob, blob.stat().st_size - 1000)
        elif damage == "deleted blob":
            blob.unlink()
        else:
            (snap / shard).unlink()
        entry = next(e for e in Library(str(hf_home)).entries() if e.repo == REPO)
        assert not entry.downloaded and entry.local_dir is None
        assert shard in entry.problem and "Download finishes it" in entry.problem
        with qtbot.waitSignal(m.finished, timeout=8000):
            m.download(REPO)
    assert (snap / shard).read_bytes() == files[shard]
    entry = next(e for e in Library(str(hf_home)).entries() if e.repo == REPO)
    assert entry.downloaded and entry.problem == ""


def test_a_gated_or_private_repo_says_how_to_log_in(manager, qtbot):
    with FakeHub({REPO: _files(), "a/private": _files()}) as hub:
        hub.refuse = {REPO: (401, "GatedRepo"), "a/private": (403, "")}
        m = manager(hub.url)
        for repo in (REPO, "a/private"):
            with qtbot.waitSignal(m.failed, timeout=5000) as failed:
                m.download(repo)
            message = failed.args[1]
            assert repo in message and "hf auth login" in message and "HF_TOKEN" in message


def test_disk_full_mid_file_names_the_file_and_keeps_the_part(manager, qtbot, hf_home, monkeypatch):
    write = BlobSink.write

    def full(self, data):  # the disk fills up after the first MiB
        if self.size >= (1 << 20):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, data)

    monkeypatch.setattr(BlobSink, "write", full)
    files = _files()
    with FakeHub({REPO: files}) as hub:
        m = manager(hub.url)
        with qtbot.waitSignal(m.failed, timeout=5000) as failed:
            m.download(REPO)
        message = failed.args[1]
        assert f"{REPO}/model.safetensors" in message and str(hf_home) in message
        assert "full" in message and "Free some space" in message
        assert [p.stat().st_size for p in hf_home.rglob("*.incomplete")] == [1 << 20]
        monkeypatch.setattr(BlobSink, "write", write)
        with qtbot.waitSignal(m.finished, timeout=5000) as done:
            m.download(REPO)
    assert (Path(done.args[1]) / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert hub.ranges_for("model.safetensors")[-1] == f"bytes={1 << 20}-"


def test_a_read_only_or_odd_cache_says_which_folder_and_what_to_do(
    qtbot, hf_home, monkeypatch, tmp_path
):
    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if str(path).startswith(str(hf_home)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *args, **kwargs)

    not_a_folder = tmp_path / "cache-is-a-file"
    not_a_folder.write_text("x")
    with FakeHub({REPO: _files()}) as hub:
        for cache, words in ((hf_home, "HF_HUB_CACHE"), (not_a_folder, "not a folder")):
            m = DownloadManager(cache_dir=str(cache), endpoint=hub.url)
            try:
                with monkeypatch.context() as patch:
                    patch.setattr(os, "mkdir", read_only)
                    with qtbot.waitSignal(m.failed, timeout=5000) as failed:
                        m.download(REPO)
            finally:
                m.shutdown()
            message = failed.args[1]
            assert REPO in message and str(cache) in message and words in message


def test_expired_download_links_are_asked_for_again(manager, qtbot):
    files = _files()
    files["model-2.safetensors"] = os.urandom(1 << 20)
    with FakeHub({REPO: files}) as hub:
        hub.cdn_ttl_s = 0.5  # the first file takes longer than a link lasts
        hub.delay_s = 0.02
        m = manager(hub.url)
        with qtbot.waitSignal(m.finished, timeout=10000) as done:
            m.download(REPO)
    for name in ("model.safetensors", "model-2.safetensors"):
        assert (Path(done.args[1]) / name).read_bytes() == files[name]


def test_a_part_of_a_file_since_changed_upstream_is_dropped(manager, qtbot, hf_home):
    old = _files()
    with FakeHub({REPO: old}) as hub:
        hub.delay_s = 0.01
        m = manager(hub.url)
        stop = [1 << 20]
        m.progress.connect(lambda _r, done, _t, _s: done > stop[0] and m.cancel())
        with qtbot.waitSignal(m.cancelled, timeout=5000):
            m.download(REPO)
        stop[0] = 1 << 40
        stale = list(hf_home.rglob("*.incomplete"))
        assert len(stale) == 1
        hub.delay_s = 0.0
        new = dict(old, **{"model.safetensors": os.urandom(2 << 20)})
        hub.repos[REPO] = new
        hub.sha = "fedcba9876543210fedcba9876543210fedcba98"  # a new revision
        with qtbot.waitSignal(m.finished, timeout=5000) as done:
            m.download(REPO)
    assert (Path(done.args[1]) / "model.safetensors").read_bytes() == new["model.safetensors"]
    assert hub.sha in done.args[1]
    assert not list(hf_home.rglob("*.incomplete")), "the old revision's part is deleted"


def _left_unfinished(qtbot, make_window, hub):
    """A window whose catalog model was downloaded from `hub` through the Models tab, then
    lost its second shard (as a download stopped short leaves it): the library rescanned."""
    window = make_window()
    downloads, panel = window.ctx.downloads, window.library
    downloads._worker.endpoint = hub.url
    panel.select(CATALOG_KEY)
    with qtbot.waitSignal(downloads.finished, timeout=8000) as done:
        panel.download_button.click()
    assert panel.use_button.isEnabled()
    (Path(done.args[1]) / "model-00002-of-00002.safetensors").resolve().unlink()
    window.ctx.library.rescan()
    return window


def test_the_panel_says_a_download_is_incomplete_and_offers_to_finish_it(
    qtbot, make_window, hf_home
):
    with FakeHub({REPO: _sharded()}) as hub:
        window = _left_unfinished(qtbot, make_window, hub)
        downloads, panel = window.ctx.downloads, window.library
        panel.select(CATALOG_KEY)
        text = panel.card(CATALOG_KEY).meta.text()
        assert "Incomplete download" in text and "model-00002-of-00002" in text
        assert not panel.use_button.isEnabled() and panel.download_button.isEnabled()
        with qtbot.waitSignal(downloads.finished, timeout=8000):
            panel.download_button.click()
    assert window.ctx.library.find(CATALOG_KEY).downloaded and panel.use_button.isEnabled()


def test_an_unfinished_download_can_be_deleted_with_its_parts(qtbot, make_window, hf_home):
    """A download left unfinished (a shard missing, a part on disk): Delete, disabled while
    it runs again, removes every file of it, the parts too, after asking; the model is then
    offered for download as before."""
    from helpers import answer_next_dialog

    with FakeHub({REPO: _sharded()}) as hub:
        window = _left_unfinished(qtbot, make_window, hub)
    downloads, panel = window.ctx.downloads, window.library
    repo_dir = next(Path(hf_home).rglob("models--*"))
    part = repo_dir / "blobs" / "0123abcd.incomplete"
    part.write_bytes(b"x" * 1000)
    window.ctx.library.rescan()
    panel.select(CATALOG_KEY)
    assert "Incomplete download" in panel.card(CATALOG_KEY).meta.text()
    assert panel.delete_button.isEnabled() and panel.delete_button.text() == "Delete"
    downloads._active = REPO  # its download resumed: not deleted from under it
    panel._update_buttons()
    assert not panel.delete_button.isEnabled()
    downloads._active = None
    panel._update_buttons()
    asked: list[str] = []
    answer_next_dialog("Cancel", asked)
    panel.delete_button.click()
    assert asked[0] == "Delete download" and part.is_file()
    answer_next_dialog("Delete from disk", asked)
    panel.delete_button.click()
    assert not repo_dir.exists() and panel.message.text() == ""
    panel.select(CATALOG_KEY)
    card = panel.card(CATALOG_KEY)
    assert "Not downloaded" in card.meta.text() and panel.download_button.isEnabled()
    assert not panel.delete_button.isEnabled()
