"""A model added from the Hugging Face Hub by its repository id: checked and planned from its
config.json before anything is downloaded, refused by name when Snug cannot run it, then
downloaded like a catalog model and kept in the list across restarts."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from hf_server import FakeHub

from app.engine_bridge import LoadRequest
from app.workers.hub_probe import RepoRefused, format_of, probe_repo, repo_id
from tests.app.conftest import FakeGpu

REPO = "someone/Qwen3.5-Tiny-Finetune"


def published(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_repository_ids_are_read_as_people_write_them():
    assert repo_id(" someone/model ") == "someone/model"
    assert repo_id("https://huggingface.co/Qwen/Qwen3.5-4B/tree/main") == "Qwen/Qwen3.5-4B"
    assert repo_id("https://hf.co/mlx-community/Qwen3.5-4B-MLX-4bit/") == (
        "mlx-community/Qwen3.5-4B-MLX-4bit"
    )
    # Pasted from the browser: no scheme, a file's or a page's address, a query, spaces.
    for pasted in (
        "huggingface.co/Qwen/Qwen3.5-4B",
        "HF.co/Qwen/Qwen3.5-4B",
        "https://huggingface.co/Qwen/Qwen3.5-4B/resolve/main/config.json",
        "https://huggingface.co/Qwen/Qwen3.5-4B?library=transformers",
        "https://huggingface.co/Qwen/Qwen3.5-4B#model-card",
        "Qwen / Qwen3.5-4B",
    ):
        assert repo_id(pasted) == "Qwen/Qwen3.5-4B", pasted
    for bad in ("model-without-owner", "a/b/c/d", "../etc/passwd", "owner/na me"):
        with pytest.raises(RepoRefused, match="owner/name"):
            repo_id(bad)
    assert format_of({"quantization": {"bits": 4, "group_size": 32}}) == ("4-bit", "mlx4", 32)
    assert format_of({}) == ("bf16", "bf16", 0)
    assert format_of({"quantization": {"bits": 8, "group_size": 64}}) == ("8-bit", None, 0)


def test_a_repository_snug_cannot_run_is_refused_before_any_download(tiny_checkpoint, hf_home):
    tiny = published(tiny_checkpoint("untied-l8-r2", "mlx4-g64"))
    llama = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"x" * 64}
    gguf = {"config.json": tiny["config.json"], "model-Q4_K_M.gguf": b"x" * 64}
    moe = {"config.json": b'{"model_type": "qwen3_5_moe"}', "model.safetensors": b"x"}
    repos = {"a/llama": llama, "a/gguf": gguf, "a/moe": moe}
    with FakeHub(repos) as hub:
        cases = {
            "a/llama": "is a llama model; Snug runs Qwen3.5",
            "a/gguf": "has no .safetensors weights (a GGUF repository?)",
            "a/moe": "mixture-of-experts",
            "a/missing": "a/missing was not found on the Hugging Face Hub",
        }
        for repo, words in cases.items():
            with pytest.raises(RepoRefused, match=re.escape(words)):
                probe_repo(repo, hub.url)
        assert not any(path.endswith(".safetensors") for _m, path, _r in hub.requests)
    with pytest.raises(RepoRefused, match=r"Cannot reach the Hugging Face Hub \(\w+\)\. Check"):
        probe_repo("a/llama", "http://127.0.0.1:9")  # nothing listens there


def test_a_gated_or_private_repository_says_how_to_log_in_before_any_download(
    tiny_checkpoint, hf_home
):
    """The Hub lists a gated repository's files to anyone, then refuses its config.json."""
    files = published(tiny_checkpoint("untied-l8-r2", "mlx4-g64"))
    with FakeHub({"a/gated": files, "a/private": files}) as hub:
        hub.refuse = {"a/gated": (401, "GatedRepo"), "a/private": (403, "")}
        for repo, words in (
            ("a/gated", "a/gated is gated: accept its licence"),
            ("a/private", "The Hub refused a/private's config.json (403)"),
        ):
            with pytest.raises(RepoRefused, match=re.escape(words)) as refused:
                probe_repo(repo, hub.url)
            assert "hf auth login" in str(refused.value)
            assert "HTTPStatusError" not in str(refused.value)
        assert "download again" not in str(refused.value)


def test_add_plan_download_and_keep_a_hub_model(qtbot, make_window, tiny_checkpoint, hf_home):
    files = published(tiny_checkpoint("untied-l8-r2", "mlx4-g64"))
    weights = sum(len(b) for n, b in files.items() if n.endswith(".safetensors"))
    with FakeHub({REPO: files}) as hub:
        window = make_window(gpu_source=FakeGpu)
        window.ctx.downloads._worker.endpoint = hub.url
        panel = window.library
        with qtbot.waitSignal(panel.repo_checked, timeout=10000):
            panel.add_repo(f"https://huggingface.co/{REPO}")
        entry = window.ctx.library.find(f"hub:{REPO}")
        assert entry is not None and not entry.downloaded and entry.size_bytes == weights
        assert entry.quant == "4-bit" and entry.fmt == "mlx4"
        assert panel.selected().key == entry.key and "added" in panel.progress_label.text()
        assert not any(p.endswith(".safetensors") for _m, p, _r in hub.requests)
        qtbot.waitUntil(lambda: panel.card(entry.key).badge.text() == "Fits", timeout=5000)
        assert panel.download_button.isEnabled()
        with qtbot.waitSignal(window.ctx.downloads.finished, timeout=10000):
            panel.download_button.click()
    entry = window.ctx.library.find(f"hub:{REPO}")
    assert entry.downloaded and panel.use_button.isEnabled()
    saved = json.loads(window.ctx.settings.store.value("library/repos"))
    assert [item["repo"] for item in saved] == [REPO]
    window.close()
    again = make_window(gpu_source=FakeGpu)
    kept = again.ctx.library.find(f"hub:{REPO}")
    assert kept is not None and kept.downloaded  # listed again, found in the cache
    assert again.ctx.library.delete(kept) == ""  # its files go; the entry stays, to download
    left = again.ctx.library.find(f"hub:{REPO}")
    assert left is not None and not left.downloaded
    again.library.select(left.key)
    assert again.library.delete_button.text() == "Remove from list"
    again.library.delete_button.click()
    assert again.ctx.library.find(f"hub:{REPO}") is None


def test_odd_saved_repositories_are_skipped(make_window, settings_store):
    good = {"repo": "someone/fine", "size": 10, "config": {"model_type": "qwen3_5"}}
    odd = [
        {"repo": "../../etc", "size": 1, "config": {}},
        {"repo": "a/b", "size": "big", "config": {}},
        {"repo": "a/c", "size": 1, "config": "not a dict"},
        "not an object",
    ]
    settings_store.setValue("library/repos", json.dumps([*odd, good]))
    window = make_window()
    hub = [e.repo for e in window.ctx.library.entries() if e.source == "hub"]
    assert hub == ["someone/fine"]
    settings_store.setValue("library/repos", "{not json")
    again = make_window()  # read as none, the window starts
    assert not [e for e in again.ctx.library.entries() if e.source == "hub"]


def test_a_model_loading_or_loaded_is_not_deleted_from_under_the_engine(
    qtbot, make_window, hf_home
):
    """Delete while the model loads (its files being read) or while it is loaded: the files
    stay and the panel says to unload it first; once unloaded, Delete deletes."""
    from fake_engine import FakeEngine
    from helpers import answer_next_dialog

    repo = "mlx-community/Qwen3.5-0.8B-MLX-4bit"  # a catalog model
    files = {"config.json": b'{"model_type": "qwen3_5"}', "model.safetensors": b"w" * 4096}
    go = threading.Event()

    def slow(request, progress=None):
        go.wait(10)
        return FakeEngine()

    window = make_window(loader=slow)
    with FakeHub({repo: files}) as hub:
        window.ctx.downloads._worker.endpoint = hub.url
        with qtbot.waitSignal(window.ctx.downloads.finished, timeout=10000):
            window.ctx.downloads.download(repo)
    entry = next(e for e in window.ctx.library.entries() if e.repo == repo and e.downloaded)
    panel, engine = window.library, window.ctx.engine
    panel.select(entry.key)
    engine.load(LoadRequest(entry.local_dir, window.ctx.settings.engine_settings(), 4096))
    for state in ("loading", "ready"):
        assert engine.state == state
        asked: list[str] = []
        answer_next_dialog("Cancel", asked, timeout_ms=200)  # where it were asked
        panel.delete_button.click()
        assert (
            asked == [] and "Unload it first" in panel.message.text() and panel.message.isVisible()
        )
        assert Path(entry.local_dir, "model.safetensors").is_file()
        if state == "loading":
            with qtbot.waitSignal(engine.loaded, timeout=5000):
                go.set()
    qtbot.wait(250)  # the watch for a question above is over
    with qtbot.waitSignal(engine.unloaded, timeout=5000):
        engine.unload()
    seen: list[str] = []
    answer_next_dialog("Delete from disk", seen)
    panel.delete_button.click()
    assert not Path(entry.local_dir).exists() and "Delete model" in seen
