"""Tiny random Qwen3.5 checkpoints (HF and MLX) and the reference runners tests compare against.

`build_hf` writes what a real `Qwen/Qwen3.5-*` repo holds, only small: a nested `qwen3_5`
config.json (with a small vision tower), `model.language_model.*` / `model.visual.*` / `mtp.*`
tensors, a byte-level BPE tokenizer.json trained here on a fixed corpus, and a ChatML
`chat_template.jinja`. `build_mlx` converts such a checkpoint with mlx-lm, as the
mlx-community `*-MLX-4bit` repos are made. `hf_logits` and `mlx_logits` run transformers
(fp32) and mlx-lm on a checkpoint with a cache, prefill then greedy decode.

torch, transformers and mlx are imported inside functions, so importing this module is cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# Qwen3.5's pre-tokenizer split (spec 6): Qwen2's regex plus \p{M} in letter runs.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BPE_VOCAB = 400  # trained tokens (256 bytes + merges); the specials come after them

CORPUS = (
    "The quick brown fox jumps over the lazy dog. A tiny model still needs a tokenizer, "
    "and this paragraph gives it the most common English words: the, of, and, to, in, is, "
    "it, that, for, on, with, as, was, at, by, this, from, be, or, an, are, not, have.",
    "Snug runs language models on small graphics cards. It plans memory before it loads "
    "anything, admits a request only when it fits, and then commits the buffers it needs.",
    "Numbers are split one digit per token: 0 1 2 3 4 5 6 7 8 9, 42, 3.14159, 2026-01-31, "
    "x = y + 1; if (a < b) { return c * 2; } else { print('done') }",
    "Le café est très bon. Élodie a commandé une crème brûlée et un thé à la menthe; "
    "où est la gare ? Ça coûte douze euros.",
    "日本語のテキストも少し入れておきます。東京は大きな都市です。"
    "今日は良い天気ですね。中文也可以：你好，世界。",
    "Emoji and symbols: 😀 🎉 🚀 👍🏽 ❤️ ✓ → ∑ π ≈ 3.14 — “quotes” and ‘apostrophes’ … ",
    "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n"
    "<think>\nTwo plus two is four.\n</think>\n\nFour.<|im_end|>\n",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n",
)

CHAT_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content or '' %}
    {%- if message.role == 'system' and loop.first %}
        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content or '' %}
        {%- if loop.index0 > ns.last_user and reasoning %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n'
                + content.lstrip('\\n') + '<|im_end|>\\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + content
            + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is true %}
        {{- '<think>\\n' }}
    {%- else %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""


@dataclass(frozen=True)
class TinySpec:
    """Shape and seed of a tiny Qwen3.5 text model (field names as in `text_config`).

    For MLX quantization every Linear's and the Embedding's input width (hidden_size,
    intermediate_size, Hv*dv, Hq*head_dim) must be a multiple of the group size, or mlx-lm
    leaves that module unquantized.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    intermediate_size: int
    vocab_size: int = 512
    tie_word_embeddings: bool = True
    seed: int = 0
    partial_rotary_factor: float = 0.25
    full_attention_interval: int = 4
    embed_std: float = 0.4  # lower = the layers, not the token's own embedding, pick the argmax

    def __post_init__(self) -> None:
        rotary = int(self.head_dim * self.partial_rotary_factor)
        if rotary <= 0 or rotary % 4:
            # mrope_section splits rotary/2 frequencies into three parts
            raise ValueError(
                f"rotary dim {rotary} (head_dim {self.head_dim}) must be a multiple of 4"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_hidden_layers < self.full_attention_interval:
            raise ValueError("need at least one full-attention layer")

    @property
    def layer_types(self) -> list[str]:
        """The interval rule (the only schedule mlx-lm knows): every 4th layer is full attention."""
        n = self.full_attention_interval
        return [
            "full_attention" if (i + 1) % n == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]

    def text_config(self, eos_token_id: int) -> dict[str, Any]:
        """The `text_config` dict for transformers' `Qwen3_5TextConfig`."""
        half = int(self.head_dim * self.partial_rotary_factor) // 2
        section = [half // 3, half // 3, half - 2 * (half // 3)]
        return {
            "model_type": "qwen3_5_text",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": self.layer_types,
            "full_attention_interval": self.full_attention_interval,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": 4,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e7,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": section,
                "mrope_interleaved": True,
            },
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "attn_output_gate": True,
            "eos_token_id": eos_token_id,
        }


# fmt: off
TINY_PRESETS: dict[str, TinySpec] = {
    # 4 layers (3 DeltaNet + 1 attention), one value head per key head, tied head.
    "tied-l4-r1": TinySpec(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=32, intermediate_size=128, tie_word_embeddings=True, seed=1,
    ),
    # 8 layers, two value heads per key head, separate lm_head.
    "untied-l8-r2": TinySpec(
        hidden_size=128, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=16, intermediate_size=256, tie_word_embeddings=False, seed=2,
    ),
    # 8 layers, four value heads per key head, head_dim 64 (rotary 16), tied head.
    "tied-l8-r4-hd64": TinySpec(
        hidden_size=64, num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, intermediate_size=192, tie_word_embeddings=True, seed=3,
        embed_std=0.2,
    ),
}
# fmt: on

# format name -> ("hf", dtype) or ("mlx", bits, group_size)
FORMATS: dict[str, tuple[Any, ...]] = {
    "hf-fp32": ("hf", "float32"),
    "hf-bf16": ("hf", "bfloat16"),
    "mlx4-g64": ("mlx", 4, 64),
    "mlx4-g32": ("mlx", 4, 32),
    "mlx8-g64": ("mlx", 8, 64),
}


# ---------------------------------------------------------------------------------------------
# Tokenizer


@functools.lru_cache(maxsize=1)
def tokenizer_json() -> str:
    """The serialized tokenizer.json, trained once per process on `CORPUS` (deterministic)."""
    import tokenizers as tk
    from tokenizers import pre_tokenizers as pre

    tok = tk.Tokenizer(tk.models.BPE())
    tok.normalizer = tk.normalizers.NFC()
    tok.pre_tokenizer = pre.Sequence(
        [
            pre.Split(tk.Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = tk.decoders.ByteLevel()
    tok.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    trainer = tk.trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    # Specials go after the trained vocabulary, as in Qwen's tokenizer.
    tok.add_special_tokens(
        [tk.AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    return tok.to_str()


def special_token_ids() -> dict[str, int]:
    """Ids of the special tokens in the tiny tokenizer."""
    added = json.loads(tokenizer_json())["added_tokens"]
    return {t["content"]: t["id"] for t in added}


def tokenizer_size() -> int:
    """Number of ids the tiny tokenizer uses (the model's vocab_size must be at least this)."""
    return max(special_token_ids().values()) + 1


def write_tokenizer(out_dir: str | Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tokenizer_json(), encoding="utf-8")
    ids = special_token_ids()
    tok_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "split_special_tokens": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "normalized": False, "lstrip": False,
                     "rstrip": False, "single_word": False}
            for t, i in ids.items()
        },
    }  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2), encoding="utf-8")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# HF checkpoint

VISION_CONFIG = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 8,
    "num_position_embeddings": 16,
}


# Init scales (std of a matrix = gain / sqrt(in_features)). Smaller gains make the model a
# near-copy of its input; larger ones make it chaotic, so that bf16 or 4-bit rounding changes
# every argmax. These keep the layers' share of the logits visible and 4-bit logits correlated.
IN_GAIN = 0.5  # projections out of a normed input (q/k/v, in_proj_*, gate/up)
OUT_GAIN = 0.7  # projections back into the residual stream (o_proj, out_proj, down_proj)
HEAD_GAIN = 1.0  # untied lm_head
RESIDUAL_OUT = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def _random_like(name: str, p: Any, embed_std: float) -> Any:
    """A random value for one text parameter, by its checkpoint name."""
    import torch

    if name.endswith("linear_attn.A_log"):
        return torch.log(torch.empty_like(p).uniform_(0.5, 8.0))
    if name.endswith("linear_attn.dt_bias"):
        return 0.5 * torch.randn_like(p) + 0.5
    if name.endswith("linear_attn.norm.weight"):  # plain-w gated norm
        return 1.0 + 0.1 * torch.randn_like(p)
    if name.endswith("conv1d.weight"):
        return 0.5 * torch.randn_like(p)
    if p.ndim == 1:  # zero-centred RMSNorm weights: the model multiplies by 1 + w
        return 0.1 * torch.randn_like(p)
    if name.endswith("embed_tokens.weight"):
        return embed_std * torch.randn_like(p)
    gain = HEAD_GAIN if name == "lm_head.weight" else IN_GAIN
    if name.endswith(RESIDUAL_OUT):
        gain = OUT_GAIN
    return gain * torch.randn_like(p) / math.sqrt(p.shape[-1])


def _randomize(model: Any, spec: TinySpec) -> None:
    """Give every text parameter a random value, including those HF inits to constants."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith("model.visual."):
                p.copy_(_random_like(name, p, spec.embed_std))


def _mtp_tensors(spec: TinySpec) -> dict[str, Any]:
    """Random `mtp.*` tensors with the real checkpoints' names and shapes (engine.testing.mtp)."""
    import torch

    from engine.testing.mtp import hf_key, random_mtp

    values = random_mtp(spec, seed=spec.seed + 7)
    return {hf_key(name): torch.from_numpy(v) for name, v in values.items()}


def _shards(tensors: dict[str, Any], max_bytes: int | None, count: int) -> list[list[str]]:
    """Split tensor names, in order, into files of at most max_bytes, or into `count` files."""
    sizes = {n: t.numel() * t.element_size() for n, t in tensors.items()}
    total = sum(sizes.values())
    limit = max(count, 1)
    if max_bytes is None:
        max_bytes = math.ceil(total / max(count, 1))
    else:
        limit = len(sizes)
    groups: list[list[str]] = [[]]
    size = 0
    for name, nbytes in sizes.items():
        if groups[-1] and size + nbytes > max_bytes and len(groups) < limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def build_hf(
    spec: TinySpec,
    out_dir: str | Path,
    dtype: str = "float32",
    max_shard_size: int | None = None,
    shards: int = 1,
) -> Path:
    """Write a random HF Qwen3.5 checkpoint for `spec` into out_dir and return its path.

    Tensors are `model.language_model.*`, `lm_head.weight` (untied only), `model.visual.*`
    (a one-block vision tower) and `mtp.*`. With dtype "bfloat16" everything is stored as
    BF16 except `linear_attn.A_log` and `linear_attn.norm.weight` (F32, as Qwen ships them).
    `max_shard_size` (bytes) or `shards` (a file count) split the weights into
    `model-0000i-of-0000N.safetensors` plus `model.safetensors.index.json`.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype {dtype!r}: choose float32 or bfloat16")
    n_tokens = tokenizer_size()
    if spec.vocab_size < n_tokens:
        raise ValueError(f"vocab_size {spec.vocab_size} < tokenizer size {n_tokens}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    eos = special_token_ids()["<|endoftext|>"]

    torch.manual_seed(spec.seed)
    vision = dict(VISION_CONFIG, out_hidden_size=spec.hidden_size)
    config = Qwen3_5Config(
        text_config=spec.text_config(eos),
        vision_config=vision,
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    model = Qwen3_5ForConditionalGeneration(config).eval()
    _randomize(model, spec)

    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if spec.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    tensors.update(_mtp_tensors(spec))
    if dtype == "bfloat16":
        keep_f32 = ("linear_attn.A_log", "linear_attn.norm.weight")
        tensors = {
            k: v if k.endswith(keep_f32) else v.to(torch.bfloat16) for k, v in tensors.items()
        }

    groups = _shards(tensors, max_shard_size, shards)
    if len(groups) == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, names in enumerate(groups):
            fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
            save_file({n: tensors[n] for n in names}, str(out / fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in names})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    top = config.to_diff_dict()
    top["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    top["dtype"] = dtype
    top["text_config"]["dtype"] = dtype
    top["eos_token_id"] = eos
    top.pop("transformers_version", None)
    (out / "config.json").write_text(json.dumps(top, indent=2, sort_keys=True))
    write_tokenizer(out)
    return out


# ---------------------------------------------------------------------------------------------
# MLX checkpoint


def build_mlx(
    spec: TinySpec,
    out_dir: str | Path,
    bits: int = 4,
    group_size: int = 64,
    dtype: str = "bfloat16",
    source_dtype: str = "bfloat16",
) -> Path:
    """Build an HF checkpoint (bf16, as Qwen ships) in a temp folder; convert it with mlx-lm.

    The result is what mlx-community publishes: quantized Linear/Embedding (U32 weights,
    scales and biases in `dtype`), other floats cast to `dtype` except A_log, `+1` baked into
    the zero-centred norms, conv1d as [C, K, 1]. out_dir must not exist or be empty.
    """
    from mlx_lm.convert import convert

    out = Path(out_dir)
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()  # convert() refuses an existing folder
    with tempfile.TemporaryDirectory(prefix="snug-tiny-") as tmp:
        hf = build_hf(spec, Path(tmp) / "hf", dtype=source_dtype)
        with contextlib.redirect_stdout(io.StringIO()):
            convert(
                str(hf), str(out), quantize=True, q_bits=bits, q_group_size=group_size, dtype=dtype
            )
        for name in ("tokenizer.json", "chat_template.jinja"):
            if not (out / name).exists():
                shutil.copy(hf / name, out / name)
    return out


def build_checkpoint(spec: TinySpec | str, fmt: str, out_dir: str | Path, shards: int = 1) -> Path:
    """Build one checkpoint in a named format (see `FORMATS`); `spec` may be a preset name."""
    if isinstance(spec, str):
        if spec not in TINY_PRESETS:
            raise ValueError(f"unknown preset {spec!r}; choose from {', '.join(TINY_PRESETS)}")
        spec = TINY_PRESETS[spec]
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    kind, *args = FORMATS[fmt]
    if kind == "mlx":
        if shards != 1:
            raise ValueError("sharding is only supported for HF formats")
        return build_mlx(spec, out_dir, bits=args[0], group_size=args[1])
    return build_hf(spec, out_dir, dtype=args[0], shards=shards)


# ---------------------------------------------------------------------------------------------
# CLI


# What each format needs beyond the app's dependencies (the project's test extra).
NEEDS = {"hf": ("torch", "transformers"), "mlx": ("torch", "transformers", "mlx", "mlx_lm")}


def describe_preset(spec: TinySpec) -> str:
    """One line: the shape of a preset, in the words of the model's config."""
    full = spec.layer_types.count("full_attention")
    ratio = spec.linear_num_value_heads // spec.linear_num_key_heads
    head = "tied embedding/lm_head" if spec.tie_word_embeddings else "separate lm_head"
    return (
        f"{spec.num_hidden_layers} layers ({spec.num_hidden_layers - full} DeltaNet + {full} "
        f"attention), hidden {spec.hidden_size}, head_dim {spec.head_dim}, {ratio} value "
        f"head(s) per key head, {head}"
    )


def missing_packages(fmt: str) -> list[str]:
    """The packages `fmt` needs that cannot be imported here."""
    import importlib

    missing = []
    for name in NEEDS[FORMATS[fmt][0]]:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def main(argv: list[str] | None = None) -> None:
    """`python -m engine.testing.tiny OUT_DIR --preset NAME --format FMT [--shards N]`."""
    presets = "\n".join(f"  {n:<17} {describe_preset(s)}" for n, s in TINY_PRESETS.items())
    formats = "\n".join(
        f"  {n:<17} "
        + (f"HF safetensors in {f[1]}" if f[0] == "hf" else f"MLX {f[1]}-bit, group {f[2]}")
        for n, f in FORMATS.items()
    )
    parser = argparse.ArgumentParser(
        prog="python -m engine.testing.tiny",
        description="Build a tiny random Qwen3.5 checkpoint (weights, config, tokenizer, chat "
        "template) for tests and smoke runs. Needs the test extra (torch, transformers; mlx "
        "and mlx-lm for MLX formats): `bash tools/test.sh` installs it into .venv.",
        epilog=f"presets:\n{presets}\n\nformats:\n{formats}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--preset", choices=sorted(TINY_PRESETS), default="tied-l4-r1")
    parser.add_argument("--format", dest="fmt", choices=list(FORMATS), default="hf-fp32")
    parser.add_argument("--shards", type=int, default=1, help="HF only: number of files")
    args = parser.parse_args(argv)
    missing = missing_packages(args.fmt)
    if missing:
        parser.exit(
            2,
            f"{parser.prog}: the {args.fmt} format needs {', '.join(missing)}, which "
            "is not installed here (it comes with the project's test extra). Install it with "
            "`bash tools/test.sh` (sets up .venv with the test extra and runs the checks) or "
            "`.venv/bin/pip install -e '.[test]'`.\n",
        )
    print(build_checkpoint(args.preset, args.fmt, args.out_dir, shards=args.shards))


if __name__ == "__main__":
    main()
