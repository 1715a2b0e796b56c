"""The Load tab follows the library: a model deleted from disk under Models is no longer
offered to Load there, and a model that comes back (downloaded again) can be loaded."""

from __future__ import annotations

import json
from pathlib import Path

from fake_engine import FakeEngine
from helpers import answer_next_dialog

from app.paths import resource

REPO = "mlx-community/Qwen3.5-0.8B-MLX-4bit"  # the catalog's qwen3.5-0.8b-4bit
REVISION = "0123456789abcdef0123456789abcdef01234567"


def cached_model(cache: Path, repo: str = REPO, shape: str = "0.8B") -> Path:
    """A whole model in the Hugging Face cache's layout (blobs, a snapshot of links, a
    ref), as a download leaves it; its weights a safetensors file of one small tensor."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snapshot = base / "snapshots" / REVISION
    for folder in (snapshot, base / "blobs", base / "refs"):
        folder.mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(REVISION)
    config = json.loads(resource("catalog.json").read_text())["shapes"][shape]
    header = json.dumps({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}).encode()
    files = {
        "config.json": json.dumps(config).encode(),
        "model.safetensors": len(header).to_bytes(8, "little") + header + bytes(8),
    }
    for i, (name, data) in enumerate(files.items()):
        blob = base / "blobs" / f"{i:040x}"
        blob.write_bytes(data)
        (snapshot / name).symlink_to(blob)
    return snapshot


def test_a_model_deleted_under_models_is_not_offered_to_load(qtbot, make_window, hf_home):
    cached_model(hf_home)
    loader = FakeEngine.loader()
    window = make_window(loader=loader)
    library, load = window.library, window.load
    window.ctx.library.rescan()
    library.select("qwen3.5-0.8b-4bit")
    library.use_button.click()  # the model on show in the Load tab
    assert load.load_button.isEnabled()

    seen: list[str] = []
    answer_next_dialog("Delete from disk", seen)
    library.delete_button.click()
    assert (
        "Delete from disk" in seen and not window.ctx.library.find("qwen3.5-0.8b-4bit").downloaded
    )
    assert not load.load_button.isEnabled()
    assert load.stage.text() == "Download this model first (Models tab) to load it."
    load.load_button.click()  # nothing to load: no request reaches the engine
    assert loader.requests == [] and window.ctx.engine.state == "empty"

    cached_model(hf_home)  # downloaded again
    window.ctx.library.rescan()
    assert load.load_button.isEnabled() and load.stage.text() == ""
    with qtbot.waitSignal(window.ctx.engine.loaded, timeout=3000):
        load.load_button.click()
    assert loader.requests[-1].model_dir == window.ctx.library.find("qwen3.5-0.8b-4bit").local_dir
