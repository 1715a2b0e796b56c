"""Random Qwen3.5 checkpoints at any shape, written with numpy (no mlx-lm, no torch).

Two layouts: HF bf16 (`model.*` names, flat `qwen3_5_text` config, conv1d [C,1,K],
zero-centred norms stored as w) and MLX affine-quantized (`language_model.model.*`, U32
codes with bf16 scales/biases from `quantize_affine`, conv1d [C,K,1], norms stored as 1+w,
config `quantization: {group_size, bits}`). Device tests build tiny ones; the decode
benchmark builds the real 0.8B/4B/9B shapes. For large shapes the random values come from a
shared pool (quantized once) sliced at random offsets, which keeps writing fast.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from engine.bf16 import from_bf16, to_bf16
from engine.checkpoint.names import (
    expected_mtp_tensors,
    expected_tensors,
    is_conv,
    is_zero_centred,
)
from engine.memory.shapes import shape_config
from engine.model_config import parse_config
from engine.testing.mtp import hf_key, random_mtp


def _real_shape(name: str) -> dict:
    """A Qwen3.5 size from the planner's table (engine.memory.shapes), in config.json keys."""
    c = shape_config(name)
    keys = (
        "hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim "
        "linear_num_key_heads linear_num_value_heads intermediate_size vocab_size "
        "tie_word_embeddings"
    ).split()
    return {k: getattr(c, k) for k in keys}


SHAPES = {
    "tiny": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        intermediate_size=512,
        vocab_size=1024,
        tie_word_embeddings=True,
    ),
    **{name: _real_shape(name) for name in ("0.8B", "2B", "4B", "9B")},
}


_TINY_EOS = 400  # engine.testing.tiny.special_token_ids()["<|endoftext|>"]


def text_config(shape: dict) -> dict:
    n = shape["num_hidden_layers"]
    return dict(
        shape,
        model_type="qwen3_5_text",
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        full_attention_interval=4,
        layer_types=[
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)
        ],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        max_position_embeddings=262144,
        hidden_act="silu",
        attention_bias=False,
        attn_output_gate=True,
        # Qwen3.5's <|im_end|>; a vocabulary too small to hold it takes the small test
        # tokenizer's end-of-text id (engine.testing.tiny), as its checkpoints do.
        eos_token_id=248044 if shape["vocab_size"] > 248044 else _TINY_EOS,
        dtype="bfloat16",
    )


def quantize_affine(w: np.ndarray, bits: int, group: int):
    """MLX affine quantization: per group of `group` columns, w ~= scale * q + bias.

    Returns (packed uint32 [out, in*bits/32], scales bf16 bits, biases bf16 bits). Scales and
    biases are rounded to bf16 first and the codes chosen against the rounded values.
    """
    out, cols = w.shape
    g = w.reshape(out, cols // group, group).astype(np.float32)
    lo, hi = g.min(-1), g.max(-1)
    levels = (1 << bits) - 1
    scale = from_bf16(to_bf16(np.where(hi > lo, (hi - lo) / levels, 1e-8)))
    bias = from_bf16(to_bf16(lo))
    q = np.clip(np.rint((g - bias[..., None]) / scale[..., None]), 0, levels).astype(np.uint32)
    per = 32 // bits
    q = q.reshape(out, cols // per, per) << (np.arange(per, dtype=np.uint32) * bits)
    packed = np.bitwise_or.reduce(q, axis=-1).astype(np.uint32)
    return packed, to_bf16(scale), to_bf16(bias)


class _Writer:
    """Streams tensors into one safetensors file (header written first, sizes known)."""

    def __init__(self, path: Path, specs: dict[str, tuple[str, tuple[int, ...]]], meta: dict):
        sizes = {"BF16": 2, "F32": 4, "U32": 4}
        header, off = {}, 0
        for name, (dt, shape) in specs.items():
            n = int(np.prod(shape)) * sizes[dt]
            header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
        header["__metadata__"] = meta
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        self.f = open(path, "wb")  # noqa: SIM115 - closed in close()
        self.f.write(struct.pack("<Q", len(raw)) + raw)
        self.order = list(specs)
        self.i = 0
        self.end = 8 + len(raw) + off

    def leave_sparse(self) -> None:
        """End the file at its full size with no data written: a sparse file of zeros that
        takes no disk, for tests that read only the headers of a large checkpoint."""
        self.f.truncate(self.end)
        self.i = len(self.order)

    def add(self, name: str, arr: np.ndarray) -> None:
        assert self.order[self.i] == name, (self.order[self.i], name)
        self.i += 1
        self.f.write(np.ascontiguousarray(arr).tobytes())

    def close(self) -> None:
        self.f.close()


class _Source:
    """Random values: exact per tensor for small models, pooled slices for large ones."""

    def __init__(self, seed: int, pooled: bool, bits: int, group: int, std: float):
        self.rng = np.random.default_rng(seed)
        self.pooled, self.bits, self.group, self.std = pooled, bits, group, std
        if pooled:
            pool = self.rng.standard_normal((4096, 4096), np.float32) * std
            self.pool_bf16 = to_bf16(pool).reshape(-1)
            if bits:
                p, s, b = quantize_affine(pool, bits, group)
                self.pool_q = (p.reshape(-1), s.reshape(-1), b.reshape(-1))

    def _slice(self, flat: np.ndarray, n: int) -> np.ndarray:
        if n <= flat.size:
            start = int(self.rng.integers(0, flat.size - n + 1))
            return flat[start : start + n]
        reps = -(-n // flat.size)
        return np.tile(flat, reps)[:n]

    def dense(self, shape: tuple[int, int]) -> np.ndarray:
        if self.pooled:
            return self._slice(self.pool_bf16, shape[0] * shape[1]).reshape(shape)
        return to_bf16(self.rng.standard_normal(shape, np.float32) * self.std)

    def quant(self, shape: tuple[int, int]):
        out, cols = shape
        if not self.pooled:
            w = self.rng.standard_normal(shape, np.float32) * self.std
            return quantize_affine(w, self.bits, self.group)
        p, s, b = self.pool_q
        per, ng = 32 // self.bits, cols // self.group
        # Slice whole pool rows' worth of words aligned to group boundaries.
        gstart = int(self.rng.integers(0, max(1, s.size - out * ng)))
        gidx = (gstart + np.arange(out * ng)) % s.size
        words = (gidx[:, None] * (self.group // per) + np.arange(self.group // per)) % p.size
        return (
            p[words].reshape(out, cols // per),
            s[gidx].reshape(out, ng),
            b[gidx].reshape(out, ng),
        )


def write_checkpoint(
    out_dir: str | Path,
    shape: str | dict,
    fmt: str = "mlx4",
    seed: int = 0,
    std: float = 0.05,
    pooled: bool | None = None,
    headers_only: bool = False,
    mtp: bool | None = None,
) -> Path:
    """Write config.json + model.safetensors for `shape` in `fmt` ('mlx4', 'mlx8', 'bf16').
    headers_only: every tensor zero, in a sparse file (instant at any size; for planning).
    mtp: the MTP head's `mtp.*` tensors, as Hugging Face files hold them; None (the default)
    as the published checkpoints: bf16 has them, MLX does not (its conversions drop them,
    engine.testing.mtp)."""
    spec = SHAPES[shape] if isinstance(shape, str) else shape
    tc = text_config(spec)
    bits = {"mlx4": 4, "mlx8": 8, "bf16": 0}[fmt]
    mtp = not bits if mtp is None else mtp
    if mtp and bits:
        raise ValueError("MLX conversions carry no mtp.* tensors (mlx-lm's sanitize drops them)")
    if mtp:
        tc["mtp_num_hidden_layers"] = 1
    group = 64
    pooled = spec["hidden_size"] >= 1024 if pooled is None else pooled
    src = _Source(seed, pooled, bits, group, std)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mats: dict[str, tuple[int, int]] = {}
    small: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, shp in expected_tensors(parse_config(tc)).items():
        if is_conv(name):
            small[name] = (shp, "conv")
        elif len(shp) == 2:
            mats[name] = shp
        elif name.endswith("dt_bias"):
            small[name] = (shp, "dt")
        elif name.endswith("A_log"):
            small[name] = (shp, "alog")
        elif is_zero_centred(name):
            small[name] = (shp, "zc")
        else:  # the gated norm (plain w)
            small[name] = (shp, "gnorm")

    mlx = bits > 0
    prefix = "language_model.model." if mlx else "model."

    def key(name: str) -> str:
        if name == "lm_head":
            return ("language_model." if mlx else "") + "lm_head"
        return prefix + name

    specs: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (o, c) in mats.items():
        if mlx:
            specs[key(name) + ".weight"] = ("U32", (o, c * bits // 32))
            specs[key(name) + ".scales"] = ("BF16", (o, c // group))
            specs[key(name) + ".biases"] = ("BF16", (o, c // group))
        else:
            specs[key(name) + ".weight"] = ("BF16", (o, c))
    for name, (shp, kind) in small.items():
        leaf = "" if kind in ("dt", "alog") else ".weight"
        if kind == "conv":
            shp = (shp[0], shp[1], 1) if mlx else (shp[0], 1, shp[1])
        dt = "F32" if kind == "alog" or (kind == "gnorm" and not mlx) else "BF16"
        specs[key(name) + leaf] = (dt, shp)

    heads = random_mtp(parse_config(tc), seed + 2, std) if mtp and not headers_only else {}
    if mtp:
        specs.update(
            {hf_key(n): ("BF16", s) for n, s in expected_mtp_tensors(parse_config(tc)).items()}
        )
    w = _Writer(out / "model.safetensors", specs, {"format": "mlx" if mlx else "pt"})
    if headers_only:
        w.leave_sparse()
        mats, small = {}, {}
    for name, shp in mats.items():
        if mlx:
            p, s, b = src.quant(shp)
            w.add(key(name) + ".weight", p)
            w.add(key(name) + ".scales", s)
            w.add(key(name) + ".biases", b)
        else:
            w.add(key(name) + ".weight", src.dense(shp))
    rng = np.random.default_rng(seed + 1)
    for name, (shp, kind) in small.items():
        leaf = "" if kind in ("dt", "alog") else ".weight"
        if kind == "zc":
            v = rng.standard_normal(shp).astype(np.float32) * 0.1 + (1.0 if mlx else 0.0)
        elif kind == "conv":
            v = rng.standard_normal(shp).astype(np.float32) * 0.3
            v = v.reshape(shp[0], shp[1], 1) if mlx else v.reshape(shp[0], 1, shp[1])
        elif kind == "dt":
            v = rng.standard_normal(shp).astype(np.float32) * 0.5
        elif kind == "alog":
            v = np.log(rng.uniform(1.0, 16.0, shp)).astype(np.float32)
        else:
            v = 1.0 + rng.standard_normal(shp).astype(np.float32) * 0.1
        dt = specs[key(name) + leaf][0]
        w.add(key(name) + leaf, v.astype(np.float32) if dt == "F32" else to_bf16(v))
    for name, v in heads.items():
        w.add(hf_key(name), to_bf16(v))
    w.close()

    if mlx:
        top = {
            "model_type": "qwen3_5",
            "text_config": tc,
            "tie_word_embeddings": tc["tie_word_embeddings"],
            "quantization": {"group_size": group, "bits": bits, "mode": "affine"},
            "quantization_config": {"group_size": group, "bits": bits, "mode": "affine"},
        }
    else:
        top = dict(tc, architectures=["Qwen3_5ForCausalLM"])
    (out / "config.json").write_text(json.dumps(top, indent=1))
    return out


def model_dir(
    workdir: str | Path, shape: str, fmt: str = "mlx4", seed: int = 1, mtp: bool | None = None
) -> Path:
    """A random checkpoint at `shape` with a small tokenizer, written once and reused: what
    the receipts tools load through `Engine.load` like a downloaded model (`mtp`: as
    `write_checkpoint`)."""
    from engine.testing.tiny import write_tokenizer

    out = Path(workdir) / f"{shape}-{fmt}-s{seed}{'-mtp' if mtp else ''}"
    if not (out / "tokenizer.json").exists():
        write_checkpoint(out, shape, fmt, seed=seed, mtp=mtp)
        write_tokenizer(out)
    return out
