"""Checkpoints made by mlx-lm's own converter, in the variants a user can download: each
loads and matches mlx-lm's logits, or is refused with a message that names the setting and
what to convert with instead."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint import Checkpoint
from engine.cli import main as snug
from engine.config import EngineSettings
from engine.errors import ConfigError
from engine.model_config import QuantSpec, parse_config
from engine.session import Engine

pytest.importorskip("mlx_lm")

from engine.testing import tiny  # noqa: E402
from engine.testing.references import mlx_logits  # noqa: E402

PRESET = "tied-l4-r1"
IDS = np.random.default_rng(7).integers(0, 400, size=24).tolist()
EIGHT_BIT = ("down_proj", "v_proj", "embed_tokens")


@pytest.fixture(scope="module")
def convert(tmp_path_factory):
    """`convert(name, **mlx_lm.convert keywords) -> folder`, from one tiny bf16 HF model."""
    from mlx_lm.convert import convert as mlx_convert

    root = tmp_path_factory.mktemp("mlx-conversions")
    hf = tiny.build_hf(tiny.TINY_PRESETS[PRESET], root / "hf", dtype="bfloat16")

    def run(name: str, source: Path = hf, **kw) -> Path:
        out = root / name
        with contextlib.redirect_stdout(io.StringIO()):
            mlx_convert(str(source), str(out), **kw)
        for file in ("tokenizer.json", "chat_template.jinja"):
            if not (out / file).exists():
                shutil.copy(hf / file, out / file)
        return out

    return run


def assert_matches_mlx_lm(folder: Path) -> None:
    ref = mlx_logits(folder, IDS, compute_dtype="float32")["prefill"]
    engine = Engine.load(folder, EngineSettings(backend="numpy"), context=64, streams=1)
    ours = engine.prefill(engine._open_stream(), IDS, all_logits=True)
    assert float(np.abs(ours - ref).max() / np.abs(ref).max()) <= 1e-4


def eight_bit_some(group_size: int | None):
    """A per-module recipe as mlx_lm.convert(quant_predicate=...) takes one: 8 bits for the
    modules mixed recipes favour, the DeltaNet gate inputs left unquantized."""

    def predicate(path: str, module) -> bool | dict:
        if path.endswith(("in_proj_a", "in_proj_b")):
            return False
        if path.endswith(EIGHT_BIT):
            return {"group_size": group_size, "bits": 8, "mode": "affine"}
        return True

    return predicate


def test_per_module_entries_with_null_group_size(convert):
    """mlx-lm writes `"group_size": null` for a per-module entry made without
    --q-group-size (its mixed recipes always do); mlx quantizes those with its default 64."""
    folder = convert("null-group", quantize=True, q_bits=4, quant_predicate=eight_bit_some(None))
    entries = json.loads((folder / "config.json").read_text())["quantization"]
    assert entries["language_model.model.layers.0.mlp.down_proj"]["group_size"] is None
    ckpt = Checkpoint.open(folder)
    assert ckpt.tensors["layers.0.mlp.down_proj"].quant == QuantSpec(8, 64)
    assert ckpt.tensors["layers.0.mlp.up_proj"].quant == QuantSpec(4, 64)
    assert ckpt.tensors["layers.0.linear_attn.in_proj_a"].quant is None
    assert_matches_mlx_lm(folder)


def test_info_names_the_modules_stored_otherwise(convert, capsys):
    """`snug info` gives the default bits and every module stored otherwise."""
    folder = convert("info-mixed", quantize=True, q_bits=4, quant_predicate=eight_bit_some(32))
    assert snug(["info", "--model", str(folder), "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["quantization"]
    assert (q["bits"], q["group_size"]) == (4, 64)
    (eight,) = q["other"]
    assert (eight["bits"], eight["group_size"]) == (8, 32)
    assert "embed_tokens" in eight["tensors"] and "layers.0.mlp.down_proj" in eight["tensors"]
    assert all(n.endswith(EIGHT_BIT) for n in eight["tensors"])
    assert "layers.0.linear_attn.in_proj_a" in q["not_quantized"]
    assert snug(["info", "--model", str(folder)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "quantization:" in x)
    assert "4-bit in groups of 64; 8-bit in groups of 32 for " in line
    assert "not quantized: layers.0.linear_attn.in_proj_a" in line


def test_modules_config_json_does_not_name(convert):
    """A file whose config.json lost its per-module entries (only the top-level 4-bit one
    left) loads as mlx-lm loads it: bits and group size read off each module's shapes."""
    folder = convert("unnamed", quantize=True, q_bits=4, quant_predicate=eight_bit_some(32))
    config = json.loads((folder / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config[key] = {k: config[key][k] for k in ("group_size", "bits", "mode")}
    (folder / "config.json").write_text(json.dumps(config))
    ckpt = Checkpoint.open(folder)
    assert ckpt.tensors["embed_tokens"].quant == QuantSpec(8, 32)
    assert ckpt.tensors["layers.3.self_attn.v_proj"].quant == QuantSpec(8, 32)
    assert ckpt.tensors["layers.3.self_attn.q_proj"].quant == QuantSpec(4, 64)
    assert_matches_mlx_lm(folder)


@pytest.mark.parametrize(
    ("recipe", "bits", "module"), [("mixed_4_6", 6, "down_proj"), ("mixed_3_4", 3, "embed_tokens")]
)
def test_mixed_recipes_are_refused_by_their_bits(convert, capsys, recipe, bits, module):
    folder = convert(recipe, quantize=True, quant_predicate=recipe)
    want = rf"{module}'\]: quantization bits = {bits} is not supported.*q_bits 4 or 8.*{recipe}"
    with pytest.raises(ConfigError, match=want):
        Checkpoint.open(folder)
    assert snug(["info", "--model", str(folder)]) == 2
    assert f"bits = {bits} is not supported" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
def test_floating_point_modes_are_refused_by_name(convert, mode):
    folder = convert(mode, quantize=True, q_mode=mode)
    with pytest.raises(ConfigError, match=rf"mode '{mode}' is not supported.*q_mode 'affine'"):
        Checkpoint.open(folder)


@pytest.mark.parametrize(
    "method",
    [
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
        {"quant_method": "fp8", "weight_block_size": [128, 128]},
    ],
)
def test_transformers_quantizations_are_refused_by_name(method):
    top = {"model_type": "qwen3_5", "quantization_config": method}
    top["text_config"] = tiny.TINY_PRESETS[PRESET].text_config(eos_token_id=400)
    name = method["quant_method"]
    with pytest.raises(ConfigError, match=rf"quant_method = '{name}' is not supported"):
        parse_config(top)
    top["quantization_config"] = {"quant_method": "mlx", "bits": 8, "group_size": 32}
    assert parse_config(top).quantization.default == QuantSpec(8, 32)


def test_upload_sharding_and_other_writers(convert, monkeypatch):
    """Many shards with an index (as mlx-lm writes a model over its 5 GB shard size; one
    quantized module's weight and scales in different files), 8-bit in groups of 128 with
    fp16 scales, and a --dequantize'd copy of the sharded one."""
    import mlx_lm.utils

    def small_shards(weights, max_file_size_gb=0):
        shards, size = [], 0
        for key, value in weights.items():
            if not shards or size + value.nbytes > 12_000:
                shards.append({})
                size = 0
            shards[-1][key] = value
            size += value.nbytes
        return shards

    with monkeypatch.context() as patch:
        patch.setattr(mlx_lm.utils, "make_shards", small_shards)
        sharded = convert("sharded", quantize=True, q_bits=4, q_group_size=32)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 8
    scales = [k for k in index if k.endswith(".scales")]
    assert any(index[k] != index[k.removesuffix(".scales") + ".weight"] for k in scales)
    q8 = convert("q8-g128-f16", quantize=True, q_bits=8, q_group_size=128, dtype="float16")
    dense = convert("dequantized", source=sharded, dequantize=True)
    assert Checkpoint.open(q8).tensors["layers.0.mlp.down_proj"].quant == QuantSpec(8, 128)
    assert Checkpoint.open(dense).config.quantization is None
    for folder in (sharded, q8, dense):
        assert_matches_mlx_lm(folder)
    assert snug(["plan", "--model", str(sharded), "--card-gib", "4", "--json"]) == 0
