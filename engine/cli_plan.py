"""`snug plan`: will this model fit on this card, how, and what to change if not.

Reads only config.json and the safetensors headers (or nothing at all with `--shape`), and
the card through NVML; it never starts CUDA.

    snug plan --model DIR [--context N] [--streams N] [--max-rows N] [--json]
    snug plan --shape 4B --format mlx4 --card-gib 4 [--kv-cache int8]
    snug plan --shape all --card-gib 4          one row per shape and format
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from engine.config import GIB, KV_CACHES, MAX_GIB, EngineSettings
from engine.device import no_gpu_reason, probe_gpu
from engine.errors import SnugError
from engine.memory import Card, Decision, TensorSpec, checkpoint_specs, decide
from engine.memory.shapes import FORMATS, SHAPES, shape_config, shape_tensor_specs
from engine.memory.speed import DEFAULT_SMALL_CARD, REFERENCE_CARDS, CardSpeed
from engine.model_config import ModelConfig

__all__ = [
    "add_kv_cache_flag",
    "add_plan_parser",
    "card_table",
    "int_at_least",
    "run_plan",
    "with_kv_cache",
]


def finite_float(text: str) -> float:
    """A flag's number: any finite float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text[:40]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text[:40]!r}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low` ("argument --x: must be >= 1, got 0")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text[:40]!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def gib_arg(text: str) -> float:
    """A GiB flag's value (--reserve-gib, --limit-gib, --card-gib): from 0 to MAX_GIB."""
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value:g}")
    if value > MAX_GIB:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_GIB:,.0f} GiB, got {value:g}")
    return value


def add_kv_cache_flag(p: argparse.ArgumentParser) -> None:
    """`--kv-cache` on a command whose engine settings it sets (plan, generate, serve)."""
    p.add_argument(
        "--kv-cache",
        choices=KV_CACHES,
        default=None,
        help="the KV cache: bf16 (the compute dtype, default) or int8 (8-bit with a scale "
        "per token and head: about half the bytes; env SNUG_KV_CACHE)",
    )


def with_kv_cache(settings: EngineSettings, args: argparse.Namespace) -> EngineSettings:
    """`settings` with the KV cache `--kv-cache` asked for, if any."""
    kv = getattr(args, "kv_cache", None)
    return settings if kv is None else dataclasses.replace(settings, kv_cache=kv)


def model_specs(model_dir: str | Path) -> tuple[ModelConfig, dict[str, TensorSpec]]:
    """The model's config and its tensor specs (headers only)."""
    from engine.checkpoint import Checkpoint

    ckpt = Checkpoint.open(model_dir)
    return ckpt.config, checkpoint_specs(ckpt)


def add_plan_parser(subparsers) -> argparse.ArgumentParser:
    """Register `plan` on an argparse subparsers object."""
    p = subparsers.add_parser("plan", help="show whether a model fits on the card, and how")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint folder (config.json + *.safetensors)")
    src.add_argument("--shape", choices=(*SHAPES, "all"), help="a Qwen3.5 size, no files needed")
    p.add_argument("--format", choices=FORMATS, default="mlx4", help="storage format for --shape")
    p.add_argument(
        "--context", type=int_at_least(1), default=4096, help="tokens per stream (default 4096)"
    )
    p.add_argument(
        "--streams", type=int_at_least(1), default=1, help="concurrent conversations (default 1)"
    )
    p.add_argument(
        "--max-rows",
        type=int_at_least(1),
        default=None,
        help="rows per forward (default: the plan's choice)",
    )
    p.add_argument(
        "--prompt-cache",
        type=int_at_least(0),
        default=None,
        help="saved states (default: streams)",
    )
    p.add_argument("--limit-gib", type=gib_arg, default=None, help="cap on engine memory (0: none)")
    p.add_argument(
        "--reserve-gib", type=gib_arg, default=None, help="GiB left free for other programs"
    )
    p.add_argument(
        "--card-gib", type=gib_arg, default=None, help="plan for an empty card this size"
    )
    p.add_argument(
        "--card-speed",
        choices=tuple(REFERENCE_CARDS),
        default=None,
        help=f"the card whose speed the prediction uses with --card-gib (default: the GPU "
        f"here, else {DEFAULT_SMALL_CARD})",
    )
    add_kv_cache_flag(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_plan)
    return p


def _card(args) -> Card | None:
    gpu = probe_gpu()
    speed: CardSpeed | None = gpu.speed if gpu is not None else None
    if args.card_speed is not None or (speed is None and args.card_gib is not None):
        speed = REFERENCE_CARDS[args.card_speed or DEFAULT_SMALL_CARD]
    if args.card_gib is not None:
        total = int(round(args.card_gib * GIB))
        # The cards Snug plans for (sm_80 and newer) run the fused prefill attention.
        return Card(total=total, free=total, speed=speed, fused_attention=True)
    if gpu is None:
        return None
    return Card(gpu.total_bytes, gpu.free_bytes, speed=speed, fused_attention=gpu.fused_attention)


def card_table(
    card_total: int,
    card_free: int,
    settings: EngineSettings,
    context: int = 4096,
    streams: int = 1,
    max_rows: int | None = None,
    fused_attention: bool = True,
) -> list[dict]:
    """One row per shape and format: weights, verdict at `context` (with the settings' KV
    cache), the largest context with the KV cache in bf16 and with the 8-bit one (at any
    prefill chunks), and the largest that keeps the fastest chunks (what a load without a
    context takes). `fused_attention`: the card runs the fused prefill attention (every
    card from sm_80)."""
    rows = []
    card = Card(total=card_total, free=card_free, fused_attention=fused_attention)
    for name in SHAPES:
        for fmt in FORMATS:
            config = shape_config(name, fmt)
            specs = shape_tensor_specs(config, fmt)
            kw = dict(streams=streams, max_rows=max_rows)
            d = decide(specs, config, settings, card, context=context, **kw)
            largest = {}
            for kv in KV_CACHES:
                s = dataclasses.replace(settings, kv_cache=kv)
                most = decide(specs, config, s, card, context=None, any_chunks=True, **kw)
                largest[kv] = most.context if most.fits else 0
            auto = decide(specs, config, settings, card, context=None, **kw)
            b = d.breakdown
            rows.append(
                {
                    "shape": name,
                    "format": fmt,
                    "weights_gb": round((b.weights + b.embeddings_on_host) / 1e9, 2),
                    "verdict": d.verdict.value,
                    "largest_context": largest["bf16"],
                    "largest_context_int8": largest["int8"],
                    "fastest_chunks_context": auto.context if auto.fits else 0,
                }
            )
    return rows


def _format_card_table(rows: list[dict], card_total: int, context: int) -> str:
    at = f"at {context:,} token{'' if context == 1 else 's'}"
    head = (
        f"{'shape':<6} {'format':<6} {'weights':>9}  {at:<28} {'largest context':<17} "
        f"{'int8 KV':<9} fastest prefill to"
    )
    lines = [f"card: {card_total / GIB:.2f} GiB", head]
    keys = ("largest_context", "largest_context_int8", "fastest_chunks_context")
    for r in rows:
        ctx, ctx8, fast = (f"{r[key]:,}" if r[key] else "-" for key in keys)
        lines.append(
            f"{r['shape']:<6} {r['format']:<6} {r['weights_gb']:>6.2f} GB  {r['verdict']:<28} "
            f"{ctx:<17} {ctx8:<9} {fast}"
        )
    return "\n".join(lines)


def run_plan(args) -> int:
    """0: fits; 1: does not fit; 2: could not plan (no model, no card)."""
    settings = EngineSettings.from_env().with_gib(reserve=args.reserve_gib, limit=args.limit_gib)
    settings = with_kv_cache(settings, args)
    card = _card(args)
    if card is None:
        print(f"{no_gpu_reason()}; pass --card-gib to plan for a card", file=sys.stderr)
        return 2
    total, free = card.total, card.free
    if args.shape == "all":
        rows = card_table(
            total, free, settings, args.context, args.streams, args.max_rows, card.fused_attention
        )
        text = (
            json.dumps(rows, indent=2)
            if args.json
            else _format_card_table(rows, total, args.context)
        )
        print(text)
        return 0
    try:
        if args.shape:
            config = shape_config(args.shape, args.format)
            specs: Mapping[str, TensorSpec] = shape_tensor_specs(config, args.format)
        else:
            config, specs = model_specs(args.model)
        decision: Decision = decide(
            specs,
            config,
            settings,
            card,
            context=args.context,
            streams=args.streams,
            max_rows=args.max_rows,
            prompt_cache_states=args.prompt_cache,
        )
    except (SnugError, ValueError, OSError) as exc:
        print(f"snug plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"model": config.source, **decision.to_dict()}, indent=2))
    else:
        print(f"model: {config.source}")
        print(decision.format_table())
    return 0 if decision.fits else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="snug")
    add_plan_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
