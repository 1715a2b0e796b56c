"""Downloads against a local stand-in for the Hub: progress, cut connection, resume, errors."""

from __future__ import annotations

import os

import pytest
from hf_server import FakeHub

from app.controllers import DownloadManager

REPO = "mlx-community/Qwen3.5-0.8B-MLX-4bit"


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
