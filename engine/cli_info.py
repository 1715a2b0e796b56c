"""`snug info`: what a checkpoint folder holds, its format, quantization, shapes and tensors
(as text, or as JSON with --json)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_info(args: argparse.Namespace) -> int:
    from engine.checkpoint import Checkpoint

    ckpt = Checkpoint.open(Path(args.model))
    c = ckpt.config
    tensors = {
        name: {"shape": list(t.shape), "dtype": t.dtype, "nbytes": t.nbytes}
        for name, t in sorted(ckpt.tensors.items())
    }
    summary = {
        "model": str(ckpt.dir),
        "format": ckpt.format,
        "total_bytes": ckpt.total_bytes,
        "quantization": _quantization(ckpt),
        "config": {
            "hidden_size": c.hidden_size,
            "layers": c.num_hidden_layers,
            "full_attention_layers": list(c.full_layers),
            "attention_heads": f"{c.num_attention_heads}q/{c.num_key_value_heads}kv x {c.head_dim}",
            "deltanet_heads": f"{c.linear_num_key_heads}k/{c.linear_num_value_heads}v x "
            f"{c.linear_key_head_dim}",
            "intermediate_size": c.intermediate_size,
            "vocab_size": c.vocab_size,
            "tie_word_embeddings": c.tie_word_embeddings,
        },
    }
    if args.json:
        print(json.dumps({**summary, "tensors": tensors}, indent=1))
        return 0
    print(f"{summary['model']}\n  format {ckpt.format}, {ckpt.total_bytes / 2**20:.1f} MiB")
    if summary["quantization"] is not None:
        print(f"  quantization: {_quantization_text(summary['quantization'])}")
    for key, value in summary["config"].items():
        print(f"  {key}: {value}")
    for name, t in tensors.items():
        print(f"  {name:48s} {t['dtype']:5s} {str(t['shape']):18s} {t['nbytes']:>12,d} B")
    return 0


def _quantization(ckpt) -> dict | None:
    """The checkpoint's quantization: the default bits and group size, and where matrices
    are stored otherwise (per-module entries, or none), by tensor name."""
    quant = ckpt.config.quantization
    if quant is None:
        return None
    out: dict = {"bits": quant.default.bits, "group_size": quant.default.group_size}
    other: dict[tuple[int, int], list[str]] = {}
    plain = []
    for name, t in sorted(ckpt.tensors.items()):
        if t.quant is None:
            if len(t.shape) == 2 and not name.endswith("conv1d"):  # a Linear or Embedding
                plain.append(name)
        elif t.quant != quant.default:
            other.setdefault((t.quant.bits, t.quant.group_size), []).append(name)
    if other:
        out["other"] = [
            {"bits": bits, "group_size": group, "tensors": names}
            for (bits, group), names in sorted(other.items())
        ]
    if plain:
        out["not_quantized"] = plain
    return out


def _quantization_text(q: dict) -> str:
    def some(names: list[str]) -> str:  # the first three names, and how many more
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    parts = [f"{q['bits']}-bit in groups of {q['group_size']}"]
    for o in q.get("other", []):
        parts.append(f"{o['bits']}-bit in groups of {o['group_size']} for {some(o['tensors'])}")
    if q.get("not_quantized"):
        parts.append(f"not quantized: {some(q['not_quantized'])}")
    return "; ".join(parts)
