"""The tiny checkpoints and the reference runners behave as the engine tests assume.

transformers and mlx-lm must load every built checkpoint, the HF runner must be
deterministic and its cached decode must agree with a full forward, and the MLX files must
hold what spec section 5 says (names, dtypes, packing, +1 norms) - checked here by
dequantizing the MLX file back into an HF checkpoint and matching mlx-lm to float tolerance.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from engine.testing import references, tiny

PRESETS = list(tiny.TINY_PRESETS)
ZERO_CENTRED = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def prompt_ids(n: int = 64) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tiny.tokenizer_json())
    ids = tok.encode(" ".join(tiny.CORPUS), add_special_tokens=False).ids
    assert len(ids) >= n
    return ids[:n]


def header(path: Path) -> dict[str, dict]:
    """The safetensors header of a file or of all files of an index: name -> dtype, shape."""
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    out: dict[str, dict] = {}
    for f in files:
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        meta = json.loads(raw[8 : 8 + n])
        meta.pop("__metadata__", None)
        out.update({k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in meta.items()})
    return out


def load_f32(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint folder as float32 / uint32 numpy arrays (bf16 via torch)."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in sorted(path.glob("*.safetensors")):
        for k, v in load_file(str(f)).items():
            out[k] = v.numpy() if v.dtype == torch.uint32 else v.float().numpy()
    return out


def dequantize(w: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int) -> np.ndarray:
    """Spec 5.3: codes packed LSB-first in uint32 words; W = scales * q + biases per group."""
    per_word = 32 // bits
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    q = (w.astype(np.uint32)[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(w.shape[0], -1).astype(np.float32)  # [out, in]
    group = q.shape[1] // scales.shape[1]
    return (q.reshape(q.shape[0], -1, group) * scales[..., None] + biases[..., None]).reshape(
        q.shape
    )


# ---------------------------------------------------------------------------------------------
# Tokenizer and template


def test_tokenizer_is_deterministic_and_has_qwen_specials() -> None:
    from tokenizers import Tokenizer

    first = tiny.tokenizer_json()
    tiny.tokenizer_json.cache_clear()
    assert tiny.tokenizer_json() == first
    ids = tiny.special_token_ids()
    assert list(ids) == list(tiny.SPECIAL_TOKENS)
    assert min(ids.values()) == tiny.BPE_VOCAB  # specials come after the trained vocab
    assert all(spec.vocab_size >= tiny.tokenizer_size() for spec in tiny.TINY_PRESETS.values())
    tok = Tokenizer.from_str(first)
    text = "Le café, 日本語 😀!<|im_start|>user\n"
    enc = tok.encode(text, add_special_tokens=False)
    assert ids["<|im_start|>"] in enc.ids
    assert tok.decode(enc.ids, skip_special_tokens=False) == text


def test_chat_template_thinking_switch() -> None:
    import jinja2

    env = jinja2.Environment()
    template = env.from_string(tiny.CHAT_TEMPLATE)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    off = template.render(messages=msgs, add_generation_prompt=True)
    on = template.render(messages=msgs, add_generation_prompt=True, enable_thinking=True)
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert off == head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert on == head + "<|im_start|>assistant\n<think>\n"


# ---------------------------------------------------------------------------------------------
# HF checkpoints


@pytest.mark.parametrize("preset", PRESETS)
def test_hf_layout(tiny_checkpoint, preset: str) -> None:
    spec = tiny.TINY_PRESETS[preset]
    path = tiny_checkpoint(preset, "hf-fp32")
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen3_5"
    assert config["text_config"]["model_type"] == "qwen3_5_text"
    assert config["eos_token_id"] == tiny.special_token_ids()["<|endoftext|>"]
    assert config["text_config"]["layer_types"] == spec.layer_types
    names = header(path)
    assert ("lm_head.weight" in names) == (not spec.tie_word_embeddings)
    assert any(n.startswith("model.visual.") for n in names)
    assert sum(n.startswith("mtp.") for n in names) == 15
    prefixes = ("model.language_model.", "model.visual.", "mtp.", "lm_head.")
    assert all(n.startswith(prefixes) for n in names)
    conv = names["model.language_model.layers.0.linear_attn.conv1d.weight"]["shape"]
    kd = spec.linear_num_key_heads * spec.linear_key_head_dim
    assert conv == [2 * kd + spec.linear_num_value_heads * spec.linear_value_head_dim, 1, 4]
    tensors = load_f32(path)
    norm = tensors["model.language_model.norm.weight"]
    assert 0 < np.abs(norm).mean() < 0.5  # zero-centred and randomized
    gated = tensors["model.language_model.layers.0.linear_attn.norm.weight"]
    assert abs(gated.mean() - 1) < 0.2 and gated.std() > 0.01
    assert tensors["model.language_model.layers.0.linear_attn.dt_bias"].std() > 0.01
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (path / name).is_file()


def test_hf_bf16_keeps_f32_where_qwen_does(tiny_checkpoint) -> None:
    names = header(tiny_checkpoint("tied-l4-r1", "hf-bf16"))
    for name, meta in names.items():
        want = "F32" if name.endswith(("linear_attn.A_log", "linear_attn.norm.weight")) else "BF16"
        assert meta["dtype"] == want, name


@pytest.mark.parametrize("preset", PRESETS)
def test_hf_runner_is_deterministic_and_not_degenerate(tiny_checkpoint, preset: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = tiny_checkpoint(preset, "hf-fp32")
    ids = prompt_ids()
    a = references.hf_logits(path, ids, decode_steps=6)
    b = references.hf_logits(path, ids, decode_steps=6)
    assert a["greedy"] == b["greedy"]
    np.testing.assert_array_equal(a["prefill"], b["prefill"])
    prefill, steps = a["prefill"], a["step_logits"]
    V = tiny.TINY_PRESETS[preset].vocab_size
    assert prefill.shape == (64, V) and steps.shape == (6, V)
    assert prefill.dtype == np.float32 and np.isfinite(prefill).all() and np.isfinite(steps).all()
    assert prefill.std(axis=-1).min() > 0.3
    assert len(set(prefill.argmax(-1).tolist())) > 8
    assert a["greedy"][0] == int(prefill[-1].argmax())
    assert a["greedy"][1:] == steps[:-1].argmax(-1).tolist()
    # The cached decode equals a full forward over prompt + generated tokens.
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids + a["greedy"]])).logits[0].numpy()
    np.testing.assert_allclose(full[:64], prefill, atol=1e-4)
    np.testing.assert_allclose(full[64:], steps, atol=1e-4)


def test_conditional_generation_and_shards_load_the_same(tiny_checkpoint) -> None:
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    path = tiny_checkpoint("untied-l8-r2", "hf-fp32")
    sharded = tiny_checkpoint("untied-l8-r2", "hf-fp32", shards=3)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    assert header(sharded) == header(path)
    ids = prompt_ids(16)
    ref = references.hf_logits(path, ids)["prefill"]
    np.testing.assert_array_equal(references.hf_logits(sharded, ids)["prefill"], ref)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        logits = model.eval()(input_ids=torch.tensor([ids])).logits[0].numpy()
    np.testing.assert_allclose(logits, ref, atol=1e-5)


def test_hf_bf16_checkpoint_tracks_fp32(tiny_checkpoint) -> None:
    ids = prompt_ids()
    ref = references.hf_logits(tiny_checkpoint("untied-l8-r2", "hf-fp32"), ids)["prefill"]
    bf16 = references.hf_logits(tiny_checkpoint("untied-l8-r2", "hf-bf16"), ids)["prefill"]
    assert np.corrcoef(ref.ravel(), bf16.ravel())[0, 1] > 0.99


# ---------------------------------------------------------------------------------------------
# MLX checkpoints


@pytest.mark.parametrize(
    ("preset", "fmt"),
    [(p, "mlx4-g64") for p in PRESETS] + [("untied-l8-r2", "mlx4-g32"), ("tied-l4-r1", "mlx8-g64")],
)
def test_mlx_layout_matches_spec(tiny_checkpoint, preset: str, fmt: str) -> None:
    spec = tiny.TINY_PRESETS[preset]
    _, bits, group = tiny.FORMATS[fmt]
    path = tiny_checkpoint(preset, fmt)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization"] == {"group_size": group, "bits": bits, "mode": "affine"}
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (path / name).is_file()
    names = header(path)
    P = "language_model.model."
    assert all(n.startswith((P, "language_model.lm_head.")) for n in names)
    assert ("language_model.lm_head.weight" in names) == (not spec.tie_word_embeddings)
    hf = load_f32(tiny_checkpoint(preset, "hf-fp32"))
    mlx = load_f32(path)
    quantized = {n[: -len(".scales")] for n in names if n.endswith(".scales")}
    assert P + "embed_tokens" in quantized
    assert spec.tie_word_embeddings or "language_model.lm_head" in quantized
    for name, meta in names.items():
        base = name.rsplit(".", 1)[0]
        if base in quantized:
            out_f = meta["shape"][0]
            if name.endswith(".weight"):
                assert meta["dtype"] == "U32"
            else:
                assert meta["dtype"] == "BF16"
                assert meta["shape"][0] == out_f
            continue
        want = "F32" if name.endswith("A_log") else "BF16"
        assert meta["dtype"] == want, name
    for layer, kind in enumerate(spec.layer_types):
        lp = f"{P}layers.{layer}."
        hp = f"model.language_model.layers.{layer}."
        mods = ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
        if kind == "linear_attention":
            mods += [f"linear_attn.{m}" for m in ("in_proj_qkv", "in_proj_z", "in_proj_a",
                                                   "in_proj_b", "out_proj")]  # fmt: skip
            conv = mlx[lp + "linear_attn.conv1d.weight"]
            C = conv.shape[0]
            assert conv.shape == (C, 4, 1)
            np.testing.assert_allclose(
                conv[:, :, 0], hf[hp + "linear_attn.conv1d.weight"][:, 0, :], atol=1e-2
            )
            # The gated norm is not shifted; A_log stays F32 and exact.
            np.testing.assert_allclose(
                mlx[lp + "linear_attn.norm.weight"], hf[hp + "linear_attn.norm.weight"], atol=1e-2
            )
            np.testing.assert_allclose(
                mlx[lp + "linear_attn.A_log"], hf[hp + "linear_attn.A_log"], atol=1e-2
            )
        else:
            mods += [f"self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj", "o_proj")]
            for norm in ("q_norm", "k_norm"):
                shifted = mlx[f"{lp}self_attn.{norm}.weight"]
                np.testing.assert_allclose(
                    shifted, 1.0 + hf[f"{hp}self_attn.{norm}.weight"], atol=1e-2
                )
        for norm in ("input_layernorm", "post_attention_layernorm"):
            np.testing.assert_allclose(
                mlx[f"{lp}{norm}.weight"], 1.0 + hf[f"{hp}{norm}.weight"], atol=1e-2
            )
        for mod in mods:
            assert lp + mod in quantized, mod
            w = mlx[lp + mod + ".weight"]
            ref = hf[hp + mod + ".weight"]
            assert w.dtype == np.uint32 and w.shape == (ref.shape[0], ref.shape[1] * bits // 32)
            assert mlx[lp + mod + ".scales"].shape == (ref.shape[0], ref.shape[1] // group)
            deq = dequantize(w, mlx[lp + mod + ".scales"], mlx[lp + mod + ".biases"], bits)
            # within one step of its group (a wrong unpacking is many steps off)
            step = np.repeat(np.abs(mlx[lp + mod + ".scales"]), group, axis=1)
            # plus bf16 rounding of the source weights and of the biases
            assert (np.abs(deq - ref) <= step + 1e-2 * np.abs(ref).max()).all(), mod
    norm = mlx[P + "norm.weight"]
    np.testing.assert_allclose(norm, 1.0 + hf["model.language_model.norm.weight"], atol=1e-2)


def dequantized_hf(mlx_dir: Path, hf_dir: Path, out: Path) -> Path:
    """An HF fp32 checkpoint holding exactly the MLX file's weights (quant undone, norms -1)."""
    from safetensors.numpy import save_file

    spec_bits = json.loads((mlx_dir / "config.json").read_text())["quantization"]["bits"]
    mlx = load_f32(mlx_dir)
    tensors: dict[str, np.ndarray] = {}
    for name, value in mlx.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")]
        if base + ".scales" in mlx:
            value = dequantize(value, mlx[base + ".scales"], mlx[base + ".biases"], spec_bits)
        if name.endswith(ZERO_CENTRED) or name == "language_model.model.norm.weight":
            value = value - 1.0
        if name.endswith("conv1d.weight"):
            value = value.transpose(0, 2, 1)  # [C, K, 1] -> [C, 1, K]
        hf_name = name.replace("language_model.model.", "model.language_model.", 1)
        hf_name = hf_name.replace("language_model.lm_head.", "lm_head.", 1)
        tensors[hf_name] = np.ascontiguousarray(value, dtype=np.float32)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(hf_dir / name, out / name)
    return out


@pytest.mark.parametrize(
    ("preset", "fmt"), [("tied-l4-r1", "mlx4-g64"), ("untied-l8-r2", "mlx4-g32")]
)
def test_mlx_lm_matches_its_file_dequantized_into_transformers(
    tiny_checkpoint, tmp_path: Path, preset: str, fmt: str
) -> None:
    mlx_dir = tiny_checkpoint(preset, fmt)
    hf_dir = dequantized_hf(mlx_dir, tiny_checkpoint(preset, "hf-fp32"), tmp_path / "deq")
    ids = prompt_ids()
    ref = references.hf_logits(hf_dir, ids, decode_steps=4)
    got = references.mlx_logits(mlx_dir, ids, decode_steps=4, compute_dtype="float32")
    scale = np.abs(ref["prefill"]).max()
    assert np.abs(got["prefill"] - ref["prefill"]).max() < 2e-3 * scale
    assert got["greedy"] == ref["greedy"]
    assert np.abs(got["step_logits"] - ref["step_logits"]).max() < 2e-3 * scale


@pytest.mark.parametrize(
    ("preset", "fmt", "min_corr"),
    [("tied-l4-r1", "mlx4-g64", 0.85), ("untied-l8-r2", "mlx4-g64", 0.75)]
    + [("tied-l8-r4-hd64", "mlx4-g64", 0.35)]
    + [("tied-l4-r1", "mlx8-g64", 0.97)],
)
def test_mlx_lm_tracks_the_fp32_source(tiny_checkpoint, preset: str, fmt: str, min_corr: float):
    ids = prompt_ids()
    ref = references.hf_logits(tiny_checkpoint(preset, "hf-fp32"), ids)["prefill"]
    got = references.mlx_logits(tiny_checkpoint(preset, fmt), ids, decode_steps=3)
    again = references.mlx_logits(tiny_checkpoint(preset, fmt), ids, decode_steps=3)
    assert got["greedy"] == again["greedy"]
    assert got["prefill"].dtype == np.float32 and np.isfinite(got["prefill"]).all()
    assert np.corrcoef(ref.ravel(), got["prefill"].ravel())[0, 1] > min_corr
