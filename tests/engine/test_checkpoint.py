"""engine.checkpoint on tiny HF and MLX checkpoints written in the test."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.bf16 import to_bf16
from engine.checkpoint import Checkpoint, QuantizedTensor
from engine.checkpoint.names import expected_tensors, is_conv, is_zero_centred
from engine.checkpoint.quantized import quantize
from engine.checkpoint.safetensors_file import SafetensorsFile
from engine.errors import CheckpointError, ConfigError
from engine.model_config import QuantSpec, parse_config

TEXT = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 128,
    "vocab_size": 96,
    "tie_word_embeddings": False,
    "eos_token_id": 95,
}
NO_WEIGHT_SUFFIX = ("dt_bias", "A_log")  # parameters, not modules: no `.weight` in the key
F32_IN_HF = ("A_log", "linear_attn.norm")  # stored in F32 by the official HF checkpoints


# -- writing helpers -------------------------------------------------------------------------


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values that bf16 holds exactly (truncated), so reads compare exactly."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Truncated to bf16 (as bf16_round), so the bits hold exactly what reads compare to."""
    return to_bf16(bf16_round(x))


def write_st(path: Path, tensors: dict[str, tuple[str, np.ndarray]], metadata=None) -> None:
    """A safetensors writer that also does BF16 (numpy has no bf16: pass uint16 bits)."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, (dtype, arr) in tensors.items():
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def write_config(folder: Path, text: dict | None = None, **top) -> None:
    cfg = {"model_type": "qwen3_5", "text_config": dict(TEXT if text is None else text), **top}
    (folder / "config.json").write_text(json.dumps(cfg))


def logical_weights(text: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random tensors for every internal name, bf16-exact, norms as effective multipliers."""
    rng = np.random.default_rng(seed)
    cfg = parse_config({"model_type": "qwen3_5", "text_config": text})
    out = {}
    for name, shape in expected_tensors(cfg).items():
        w = bf16_round(rng.standard_normal(shape).astype(np.float32) * 0.5 + 0.1)
        out[name] = w + 1 if is_zero_centred(name) else w  # HF stores w exactly
    return out


def hf_tensors(weights: dict[str, np.ndarray], prefix="model.language_model.") -> dict:
    out = {}
    for name, w in weights.items():
        key = "lm_head.weight" if name == "lm_head" else prefix + name
        if not name.endswith(NO_WEIGHT_SUFFIX) and name != "lm_head":
            key += ".weight"
        stored = w - 1 if is_zero_centred(name) else w
        if is_conv(name):
            stored = stored[:, None, :]  # [C, 1, K]
        if name.endswith(F32_IN_HF):
            out[key] = ("F32", stored.astype(np.float32))
        else:
            out[key] = ("BF16", bf16_bits(stored))
    return out


def write_hf(folder: Path, weights: dict[str, np.ndarray], text: dict | None = None) -> None:
    write_config(folder, text)
    write_st(folder / "model.safetensors", hf_tensors(weights), {"format": "pt"})


QUANTIZED_SUFFIXES = ("_proj", "in_proj_a", "in_proj_b", "embed_tokens", "lm_head")


def mlx_tensors(weights: dict[str, np.ndarray], quant: dict) -> tuple[dict, dict]:
    """MLX file content and, per name, what `read` must return (dequantized for q tensors)."""
    out, expect = {}, {}
    for name, w in weights.items():
        path = "language_model.lm_head" if name == "lm_head" else "language_model.model." + name
        if name.endswith(NO_WEIGHT_SUFFIX):
            dtype = "F32" if name.endswith("A_log") else "BF16"
            out[path] = (dtype, w)
            expect[name] = w if dtype == "F32" else bf16_round(w)
            continue
        spec = quant.get(path, quant)
        if name.endswith(QUANTIZED_SUFFIXES) and spec is not False:
            q = quantize(w, spec["bits"], spec["group_size"])
            scales, biases = bf16_round(q.scales), bf16_round(q.biases)
            out[path + ".weight"] = ("U32", q.packed)
            out[path + ".scales"] = ("BF16", scales)
            out[path + ".biases"] = ("BF16", biases)
            expect[name] = reference_dequantize(
                q.packed, scales, biases, spec["bits"], spec["group_size"]
            )
            continue
        out[path + ".weight"] = ("BF16", w[:, :, None] if is_conv(name) else w)  # [C, K, 1]
        expect[name] = bf16_round(w)
    out = {k: (d, bf16_bits(a) if d == "BF16" else a) for k, (d, a) in out.items()}
    return out, expect


def reference_dequantize(packed, scales, biases, bits, group_size) -> np.ndarray:
    """Spec 5.3 written out element by element."""
    rows, words = packed.shape
    cols = words * 32 // bits
    w = np.zeros((rows, cols), dtype=np.float32)
    for r in range(rows):
        for j in range(cols):
            word = int(packed[r, j * bits // 32])
            q = (word >> ((j * bits) % 32)) & ((1 << bits) - 1)
            g = j // group_size
            w[r, j] = np.float32(scales[r, g]) * np.float32(q) + np.float32(biases[r, g])
    return w


# -- HF --------------------------------------------------------------------------------------


def test_hf_single_file(tmp_path):
    weights = logical_weights(TEXT)
    tensors = hf_tensors(weights)
    tensors["model.visual.blocks.0.attn.qkv.weight"] = ("BF16", np.zeros((4, 4), np.uint16))
    tensors["mtp.fc.weight"] = ("BF16", bf16_bits(np.ones((64, 128), np.float32)))
    tensors["mtp.norm.weight"] = ("BF16", bf16_bits(np.full(64, 0.25, np.float32)))
    write_config(tmp_path)
    write_st(tmp_path / "model.safetensors", tensors)

    ckpt = Checkpoint.open(tmp_path)
    assert ckpt.format == "hf" and ckpt.dir == tmp_path
    assert ckpt.config.hidden_size == 64
    assert not any(n.startswith("visual") or "visual" in n for n in ckpt.tensors)
    for name, w in weights.items():
        got = ckpt.read(name)
        assert got.dtype == np.float32 and got.shape == w.shape, name
        np.testing.assert_allclose(got, w, rtol=0, atol=1e-6, err_msg=name)
    # Norms: HF stores w, read returns 1 + w; the gated norm is never shifted.
    raw = ckpt.read_raw("layers.0.input_layernorm")
    assert raw.dtype == np.uint16
    assert ckpt.norm_offset("layers.3.self_attn.q_norm") == 1.0
    assert ckpt.norm_offset("layers.0.linear_attn.norm") == 0.0
    assert ckpt.read_raw("layers.0.linear_attn.conv1d").shape == (128, 1, 4)
    np.testing.assert_array_equal(ckpt.read("mtp.norm"), np.full(64, 1.25, np.float32))
    assert ckpt.tensors["mtp.fc"].shape == (64, 128)

    info = ckpt.tensors["layers.0.linear_attn.conv1d"]
    assert info.shape == (128, 4) and info.dtype == "bf16" and info.quant is None
    assert info.nbytes == 128 * 4 * 2 and info.file == "model.safetensors"
    assert ckpt.tensors["layers.0.linear_attn.A_log"].dtype == "f32"
    assert ckpt.total_bytes == sum(t.nbytes for t in ckpt.tensors.values())
    np.testing.assert_array_equal(
        ckpt.read("embed_tokens", rows=slice(5, 9)), weights["embed_tokens"][5:9]
    )


def test_hf_sharded_with_index(tmp_path):
    weights = logical_weights(TEXT, seed=1)
    tensors = hf_tensors(weights)
    keys = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    weight_map = {}
    for shard, names in shards.items():
        write_st(tmp_path / shard, {k: tensors[k] for k in names})
        weight_map.update({k: shard for k in names})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    write_config(tmp_path)

    ckpt = Checkpoint.open(tmp_path)
    assert {t.file for t in ckpt.tensors.values()} == set(shards)
    for name in ("lm_head", "layers.3.self_attn.k_norm", "layers.2.linear_attn.conv1d"):
        np.testing.assert_allclose(ckpt.read(name), weights[name], atol=1e-6)


def test_flat_causal_lm_save(tmp_path):
    text = {**TEXT, "model_type": "qwen3_5_text", "tie_word_embeddings": True}
    weights = logical_weights(text, seed=2)
    (tmp_path / "config.json").write_text(json.dumps(text))
    write_st(tmp_path / "model.safetensors", hf_tensors(weights, prefix="model."))
    ckpt = Checkpoint.open(tmp_path)
    assert "lm_head" not in ckpt.tensors
    np.testing.assert_allclose(ckpt.read("norm"), weights["norm"], atol=1e-6)


def test_official_writer_dtypes(tmp_path):
    arrays = {
        "a": np.arange(6, dtype=np.float16).reshape(2, 3),
        "b": np.arange(4, dtype=np.float32),
        "c": np.arange(5, dtype=np.int64),
        "d": np.arange(3, dtype=np.uint8),
        "e": np.arange(4, dtype=np.uint32).reshape(2, 2),
        "f": np.arange(4, dtype=np.int32),
    }
    save_file(arrays, str(tmp_path / "x.safetensors"))
    f = SafetensorsFile(tmp_path / "x.safetensors")
    for name, arr in arrays.items():
        np.testing.assert_array_equal(f.read(name), arr)
        assert f.read(name).dtype == arr.dtype


def test_bf16_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    t = torch.randn(7, 5, dtype=torch.float32).to(torch.bfloat16)
    save_torch({"w": t}, str(tmp_path / "t.safetensors"))
    got = SafetensorsFile(tmp_path / "t.safetensors").read("w")
    np.testing.assert_array_equal(got, t.float().numpy())


# -- MLX -------------------------------------------------------------------------------------


@pytest.mark.parametrize("group_size", [32, 64])
def test_mlx_quantized(tmp_path, group_size):
    text = {**TEXT, "tie_word_embeddings": True}
    weights = logical_weights(text, seed=3)
    q8 = "language_model.model.layers.3.self_attn.q_proj"
    dense = "language_model.model.layers.0.linear_attn.in_proj_a"
    quant = {"group_size": group_size, "bits": 4, q8: {"group_size": 64, "bits": 8}, dense: False}
    tensors, expect = mlx_tensors(weights, quant)
    tensors["vision_tower.patch_embed.weight"] = ("BF16", np.zeros((2, 2), np.uint16))
    write_config(tmp_path, text, quantization=quant)
    write_st(tmp_path / "model.safetensors", tensors, {"format": "mlx"})

    ckpt = Checkpoint.open(tmp_path)
    assert ckpt.format == "mlx"
    assert not any("vision" in n for n in ckpt.tensors)
    up = ckpt.tensors["layers.0.mlp.up_proj"]
    assert up.shape == (128, 64) and up.dtype == "q4" and up.quant.group_size == group_size
    assert up.nbytes == 128 * 64 // 2 + 2 * 128 * (64 // group_size) * 2
    qp = ckpt.tensors["layers.3.self_attn.q_proj"]
    assert qp.dtype == "q8" and qp.quant.bits == 8 and qp.shape == (128, 64)
    assert ckpt.tensors["layers.0.linear_attn.in_proj_a"].quant is None
    for name, want in expect.items():
        got = ckpt.read(name)
        if isinstance(got, QuantizedTensor):
            assert got.shape == want.shape
            got = got.dequantize()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=name)
    # MLX norms already hold 1 + w: returned as stored.
    norm = weights["layers.1.input_layernorm"]
    np.testing.assert_array_equal(ckpt.read("layers.1.input_layernorm"), bf16_round(norm))
    assert ckpt.read("layers.1.linear_attn.conv1d").shape == (128, 4)
    packed, scales, biases = ckpt.read_raw("embed_tokens")
    assert packed.dtype == np.uint32 and scales.dtype == np.uint16 and biases.shape == scales.shape
    rows = ckpt.read("embed_tokens").dequantize(slice(10, 13))
    np.testing.assert_allclose(rows, expect["embed_tokens"][10:13], atol=1e-6)


def test_mlx_quantized_matches_mlx_core():
    mx = pytest.importorskip("mlx.core")
    rng = np.random.default_rng(4)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    for bits, g in ((4, 32), (4, 64), (8, 64), (4, 128)):
        wq, s, b = mx.quantize(mx.array(w), group_size=g, bits=bits)
        qt = QuantizedTensor(np.array(wq), np.array(s), np.array(b), bits, g, (8, 128))
        want = np.array(mx.dequantize(wq, s, b, group_size=g, bits=bits))
        np.testing.assert_allclose(qt.dequantize(), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 64), (8, 32), (8, 128)])
def test_quantize_dequantize_round_trip(bits, group_size):
    rng = np.random.default_rng(bits * group_size)
    w = rng.standard_normal((5, 256)).astype(np.float32)
    w[1, :group_size] = 0.75  # a constant group: scale 0
    q = quantize(w, bits, group_size)
    want = reference_dequantize(q.packed, q.scales, q.biases, bits, group_size)
    got = q.dequantize()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # Each value is within half a quantization step of the original.
    step = np.repeat(q.scales, group_size, axis=1)
    assert np.all(np.abs(got - w) <= step / 2 + 1e-6)
    np.testing.assert_allclose(q.dequantize(slice(2, 4)), got[2:4], atol=0)
    np.testing.assert_allclose(q.dequantize(np.array([4, 0])), got[[4, 0]], atol=0)


# -- bad inputs ------------------------------------------------------------------------------


def test_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="config.json not found"):
        Checkpoint.open(tmp_path)


def test_missing_weights(tmp_path):
    write_config(tmp_path)
    with pytest.raises(CheckpointError, match=r"no weights found; expected model\.safetensors"):
        Checkpoint.open(tmp_path)


def test_truncated_file(tmp_path):
    write_hf(tmp_path, logical_weights(TEXT))
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: file is truncated: tensor"):
        Checkpoint.open(tmp_path)


def test_bad_header_json(tmp_path):
    write_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 6) + b"{oops}")
    with pytest.raises(CheckpointError, match="header is not valid JSON"):
        Checkpoint.open(tmp_path)


def test_unknown_dtype(tmp_path):
    write_st(tmp_path / "x.safetensors", {"w": ("Q2K", np.zeros(4, np.uint8))})
    with pytest.raises(
        CheckpointError, match=r"x\.safetensors: tensor 'w' has unknown dtype 'Q2K'"
    ):
        SafetensorsFile(tmp_path / "x.safetensors")


def test_wrong_shape(tmp_path):
    weights = logical_weights(TEXT)
    weights["layers.1.mlp.up_proj"] = np.zeros((129, 64), np.float32)
    write_hf(tmp_path, weights)
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: tensor layers\.1\.mlp\.up_proj .*has shape \[129, 64\] "
        r"but config\.json implies \[128, 64\]",
    ):
        Checkpoint.open(tmp_path)


def test_missing_tensor(tmp_path):
    weights = logical_weights(TEXT)
    del weights["layers.2.linear_attn.dt_bias"]
    write_hf(tmp_path, weights)
    with pytest.raises(CheckpointError, match=r"tensor layers\.2\.linear_attn\.dt_bias is missing"):
        Checkpoint.open(tmp_path)


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **TEXT}))
    with pytest.raises(ConfigError, match="model_type 'llama' is not supported"):
        Checkpoint.open(tmp_path)


def test_bits_3(tmp_path):
    write_config(tmp_path, quantization={"group_size": 64, "bits": 3})
    with pytest.raises(ConfigError, match="bits = 3 is not supported"):
        Checkpoint.open(tmp_path)


def test_missing_shard(tmp_path):
    tensors = hf_tensors(logical_weights(TEXT))
    keys = sorted(tensors)
    write_st(tmp_path / "model-00001-of-00002.safetensors", {k: tensors[k] for k in keys[:10]})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in keys[:10]}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in keys[10:]})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    write_config(tmp_path)
    with pytest.raises(
        CheckpointError, match=r"shard model-00002-of-00002\.safetensors .*is missing"
    ):
        Checkpoint.open(tmp_path)


def test_index_refuses_paths(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../model.safetensors"}})
    )
    write_config(tmp_path)
    with pytest.raises(CheckpointError, match="is not a file name in this folder"):
        Checkpoint.open(tmp_path)


def test_scales_do_not_match_a_named_group_size(tmp_path):
    """A module config.json names explicitly must hold what the entry says."""
    text = {**TEXT, "tie_word_embeddings": True}
    tensors, _ = mlx_tensors(logical_weights(text), {"group_size": 32, "bits": 4})
    up = "language_model.model.layers.0.mlp.up_proj"
    write_config(
        tmp_path,
        text,
        quantization={"group_size": 32, "bits": 4, up: {"bits": 4, "group_size": 64}},
    )
    write_st(tmp_path / "model.safetensors", tensors, {"format": "mlx"})
    with pytest.raises(
        CheckpointError, match=r"up_proj.*group_size = 64 .*do not match the weights"
    ):
        Checkpoint.open(tmp_path)


def test_unnamed_modules_take_bits_and_group_size_from_their_shapes(tmp_path):
    """As mlx-lm's loader: a module config.json does not name is read with the bits and
    group size its shapes imply, whatever the top-level entry says; one whose shapes imply
    an unsupported width is refused by name."""
    text = {**TEXT, "tie_word_embeddings": True}
    weights = logical_weights(text, seed=5)
    embed = "language_model.model.embed_tokens"
    tensors, expect = mlx_tensors(
        weights, {"group_size": 32, "bits": 4, embed: {"group_size": 64, "bits": 8}}
    )
    write_config(tmp_path, text, quantization={"group_size": 64, "bits": 4})
    write_st(tmp_path / "model.safetensors", tensors, {"format": "mlx"})
    ckpt = Checkpoint.open(tmp_path)
    assert ckpt.tensors["embed_tokens"].quant == QuantSpec(8, 64)
    assert ckpt.tensors["layers.0.mlp.up_proj"].quant == QuantSpec(4, 32)
    for name in ("embed_tokens", "layers.0.mlp.up_proj", "layers.3.self_attn.o_proj"):
        got = ckpt.read(name).dequantize()
        np.testing.assert_allclose(got, expect[name], rtol=0, atol=1e-6, err_msg=name)

    # A quarter of the words: 2-bit codes for the embedding's 64 columns.
    packed = tensors[embed + ".weight"][1]
    tensors[embed + ".weight"] = ("U32", packed[:, : packed.shape[1] // 4])
    write_st(tmp_path / "model.safetensors", tensors, {"format": "mlx"})
    with pytest.raises(
        CheckpointError,
        match=r"embed_tokens is stored as 2-bit codes in groups of 64.*bits = 2 is not supported",
    ):
        Checkpoint.open(tmp_path)


def test_scales_without_quantization_config(tmp_path):
    text = {**TEXT, "tie_word_embeddings": True}
    tensors, _ = mlx_tensors(logical_weights(text), {"group_size": 64, "bits": 4})
    write_config(tmp_path, text)
    write_st(tmp_path / "model.safetensors", tensors, {"format": "mlx"})
    with pytest.raises(CheckpointError, match="gives no quantization for it"):
        Checkpoint.open(tmp_path)


def test_model_name_of_a_cache_snapshot_is_its_repository(tmp_path):
    from engine.checkpoint.checkpoint import model_name

    repo = tmp_path / "hub" / "models--mlx-community--Qwen3.5-4B-MLX-4bit"
    assert model_name(repo / "snapshots" / ("ab" * 20)) == "Qwen3.5-4B-MLX-4bit"
    assert model_name(str(repo / "snapshots" / ("ab" * 20)) + "/") == "Qwen3.5-4B-MLX-4bit"
    assert model_name(tmp_path / "my-qwen") == "my-qwen"
    assert model_name(tmp_path / "snapshots" / "v1") == "v1"  # not a cache: the folder's own
