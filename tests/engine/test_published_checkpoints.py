"""Checkpoints in the shapes the publishers ship them: the config.json files of published
Qwen3.5 folders (tests/fixtures/published/), Qwen's sharded safetensors behind an index,
the vision tower and the MTP head present or absent, an mlx-community conversion that keeps
the vision tower. Each one opens, and the numpy engine gives exactly what it gives on the
plain tiny checkpoint with the same weights, and what transformers gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint import Checkpoint
from engine.config import EngineSettings
from engine.model_config import load_config, parse_config
from engine.session import Engine, GenerationParams

pytest.importorskip("torch")
pytest.importorskip("transformers")

PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
MLX_4B = json.loads((PUBLISHED / "Qwen3.5-4B-MLX-4bit.config.json").read_text(encoding="utf-8"))
MLX_2B = json.loads((PUBLISHED / "Qwen3.5-2B-MLX-bf16.config.json").read_text(encoding="utf-8"))
TEMPLATE = (PUBLISHED / "Qwen3.5-27B.chat_template.jinja").read_text(encoding="utf-8")
TOKENIZER_CONFIG = json.loads(
    (PUBLISHED / "Qwen3.5-2B-MLX-bf16.tokenizer_config.json").read_text(encoding="utf-8")
)
PRESET = "tied-l4-r1"
NUMPY = EngineSettings(backend="numpy")
IDS = list(range(5, 75))  # crosses the 64-row prefill window
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Two plus two?"}]


def test_published_configs_read_as_their_models() -> None:
    four = parse_config(MLX_4B, "Qwen3.5-4B-MLX-4bit config.json")
    assert (four.hidden_size, four.num_hidden_layers, four.intermediate_size) == (2560, 32, 9216)
    assert four.layer_types.count("full_attention") == 8 and four.layer_types[3] == "full_attention"
    assert (four.linear_num_key_heads, four.linear_num_value_heads, four.head_dim) == (16, 32, 256)
    assert four.tie_word_embeddings and four.mtp_num_hidden_layers == 1
    assert four.quantization is not None and four.quantization.default.bits == 4
    assert four.quantization.default.group_size == 64
    assert set(four.eos_token_ids) == {248044, 248046}  # text_config's and the top level's
    assert (four.rope_theta, four.partial_rotary_factor) == (1e7, 0.25)
    two = parse_config(MLX_2B, "Qwen3.5-2B-MLX-bf16 config.json")  # rope_parameters["type"]
    assert (two.hidden_size, two.num_hidden_layers, two.num_attention_heads) == (2048, 24, 8)
    assert two.quantization is None and two.eos_token_ids == (248044,)
    assert (two.rope_theta, two.partial_rotary_factor) == (1e7, 0.25)


HF_SHAPES = {
    # name: (published config, build_published_hf keywords)
    "vision-mtp-qwen-shards": (MLX_4B, {"mtp": True, "vision": True, "shards": 2, "names": "qwen"}),
    "vision-no-mtp-hf-shards": (MLX_4B, {"mtp": False, "vision": True, "shards": 3, "names": "hf"}),
    "text-only-mtp": (MLX_2B, {"mtp": True, "vision": False, "shards": 2, "names": "qwen"}),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`built(kind)`: one published-shape folder per kind, built once for the module."""
    from engine.testing.published import build_published_hf, build_published_mlx
    from engine.testing.tiny import TINY_PRESETS

    spec, cache = TINY_PRESETS[PRESET], {}

    def get(kind: str) -> Path:
        if kind not in cache:
            out = tmp_path_factory.mktemp(kind)
            if kind == "mlx-vlm":
                cache[kind] = build_published_mlx(spec, out, MLX_4B, template=TEMPLATE)
            else:
                published, kw = HF_SHAPES[kind]
                cache[kind] = build_published_hf(
                    spec, out, published, template=TEMPLATE, tokenizer_config=TOKENIZER_CONFIG, **kw
                )
        return cache[kind]

    return get


def _run(model_dir: Path) -> tuple[np.ndarray, list[int], list[int]]:
    """Prefill logits of IDS, and greedy tokens for IDS and for the chat (official template)."""
    engine = Engine.load(model_dir, NUMPY, context=256, max_rows=64)
    stream = engine._open_stream()
    logits = engine.prefill(stream, IDS, all_logits=True)
    engine._close_stream(stream)
    params = GenerationParams(max_new_tokens=6, greedy=True)
    tokens = [e.token_id for e in engine.generate(IDS, params)]
    chat = [e.token_id for e in engine.generate(engine.chat_ids(CHAT), params)]
    return logits, tokens, chat


@pytest.mark.parametrize("kind", sorted(HF_SHAPES))
def test_hf_published_shapes_open_and_generate(built, tiny_checkpoint, kind) -> None:
    folder = built(kind)
    published, kw = HF_SHAPES[kind]
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(files) == kw["shards"] and "model.safetensors" not in files
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(k.startswith("mtp.") for k in weight_map) == kw["mtp"]
    assert any(k.startswith("model.visual.") for k in weight_map) == kw["vision"]
    assert ("vision_config" in json.loads((folder / "config.json").read_text())) == kw["vision"]

    ckpt = Checkpoint.open(folder)
    plain = Checkpoint.open(tiny_checkpoint(PRESET, "hf-bf16"))
    assert ckpt.format == "hf" and ckpt.config.mtp_num_hidden_layers == 1
    assert not any("visual" in name for name in ckpt.tensors)
    assert any(name.startswith("mtp.") for name in ckpt.tensors) == kw["mtp"]
    assert ckpt.required == plain.required
    for name in ckpt.required:
        got, want = ckpt.info(name), plain.info(name)
        assert (got.shape, got.dtype, got.nbytes) == (want.shape, want.dtype, want.nbytes), name
    for name in ("embed_tokens", "layers.0.linear_attn.conv1d", "layers.3.self_attn.q_norm"):
        np.testing.assert_array_equal(ckpt.read(name), plain.read(name))

    logits, tokens, chat = _run(folder)
    ref_logits, ref_tokens, ref_chat = _run(plain.dir)
    np.testing.assert_array_equal(logits, ref_logits)
    assert tokens == ref_tokens and chat == ref_chat and len(chat) > 0


def test_hf_published_shape_matches_transformers(built) -> None:
    """transformers reads the same folder (Qwen's shard names, the publisher's config keys)
    and computes what the numpy engine computes."""
    from engine.testing.references import hf_logits

    folder = built("vision-mtp-qwen-shards")
    ref = hf_logits(folder, IDS, decode_steps=4)
    logits, tokens, _ = _run(folder)
    err = np.abs(logits - ref["prefill"]).max() / np.abs(ref["prefill"]).max()
    assert err < 1e-4, err
    assert tokens[:4] == ref["greedy"]


def test_mlx_community_shape_opens_and_generates(built, tiny_checkpoint) -> None:
    """An mlx-vlm style conversion: the published 4-bit config (vision_config, quantization
    and quantization_config, mtp_num_hidden_layers without mtp weights), unquantized
    `vision_tower.*` beside the quantized text model, two shards and an index."""
    pytest.importorskip("mlx_lm")
    folder = built("mlx-vlm")
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["quantization"]
        == config["quantization_config"]
        == {
            "group_size": 64,
            "bits": 4,
            "mode": "affine",
        }
    )
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(k.startswith("vision_tower.") for k in weight_map)
    assert not any(".mtp." in k or k.startswith("mtp.") for k in weight_map)
    assert load_config(folder).quantization is not None

    ckpt = Checkpoint.open(folder)
    plain = Checkpoint.open(tiny_checkpoint(PRESET, "mlx4-g64"))
    assert ckpt.format == "mlx" and ckpt.tensors.keys() == plain.tensors.keys()
    assert ckpt.total_bytes == plain.total_bytes  # the vision tower is not counted
    logits, tokens, chat = _run(folder)
    ref_logits, ref_tokens, ref_chat = _run(plain.dir)
    np.testing.assert_array_equal(logits, ref_logits)
    assert tokens == ref_tokens and chat == ref_chat


def test_published_tokenizer_config_in_a_checkpoint(built) -> None:
    """The transformers-5 tokenizer_config.json of a published folder (no added-token table,
    eos <|endoftext|>, model-specific vision tokens): both stop tokens end a reply."""
    from engine.tokenizer import Tokenizer

    tok = Tokenizer.load(built("text-only-mtp"), load_config(built("text-only-mtp")).eos_token_ids)
    for name in ("<|endoftext|>", "<|im_end|>"):
        assert tok.token_to_id(name) in tok.eos_ids
    text = tok.apply_chat_template(CHAT)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n<think>\n")
