"""The library takes model folders shaped as the publishers ship them (tests/fixtures/
published/): Qwen's shard names behind an index, the vision tower and MTP head in the HF
weights, an mlx-community conversion that keeps its vision tower. Each is recognised as a
Qwen3.5 folder, sized by its shards, and planned with the weights the engine will hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import planning
from app.state.catalog import FolderRefused, _is_qwen35, check_model_folder, folder_size
from engine.config import EngineSettings

PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
PRESET = "tied-l4-r1"


def _published(name: str) -> dict:
    return json.loads((PUBLISHED / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.testing.published import build_published_hf
    from engine.testing.tiny import TINY_PRESETS

    spec = TINY_PRESETS[PRESET]
    config = _published("Qwen3.5-4B-MLX-4bit.config.json")
    out = {"hf": build_published_hf(spec, tmp_path_factory.mktemp("hf"), config)}
    try:
        import mlx_lm  # noqa: F401
    except ImportError:
        return out
    from engine.testing.published import build_published_mlx

    out["mlx"] = build_published_mlx(spec, tmp_path_factory.mktemp("mlx"), config)
    return out


@pytest.mark.parametrize("kind", ["hf", "mlx"])
def test_published_folders_are_recognised_sized_and_planned(folders, tiny_checkpoint, kind):
    if kind not in folders:
        pytest.skip("mlx-lm is not installed here")
    folder = folders[kind]
    check_model_folder(folder)
    assert _is_qwen35(str(folder))
    shards = sorted(folder.glob("*.safetensors"))
    assert len(shards) == 2 and folder_size(str(folder)) == sum(p.stat().st_size for p in shards)

    gpu = planning.Gpu("Test GPU", 4 << 30, 3 << 30)
    kw = dict(gpu=gpu, settings=EngineSettings(), context=2048, streams=1, max_rows=128)
    decision = planning.plan(model_dir=str(folder), **kw)
    assert planning.verdict_label(decision).startswith("Fits"), decision
    plain = tiny_checkpoint(PRESET, "hf-bf16" if kind == "hf" else "mlx4-g64")
    same = planning.plan(model_dir=str(plain), **kw)
    # The vision tower is not planned; the text weights are those of the same model.
    assert planning.breakdown_value(decision, "weights") == planning.breakdown_value(
        same, "weights"
    )


def test_published_config_alone_is_not_a_model_folder(tmp_path):
    """A folder with the published config.json but no weights is refused, naming what lacks."""
    (tmp_path / "config.json").write_text(
        (PUBLISHED / "Qwen3.5-4B-MLX-4bit.config.json").read_text(encoding="utf-8")
    )
    with pytest.raises(FolderRefused, match=r"\.safetensors"):
        check_model_folder(tmp_path)
    (tmp_path / "model.safetensors-00001-of-00002.safetensors").write_bytes(b"\0" * 16)
    check_model_folder(tmp_path)  # Qwen's shard name is a weight file
