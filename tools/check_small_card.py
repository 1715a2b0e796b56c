"""Receipt: a 4 GiB card simulated with Snug's memory limit, serving a 4B-shape model.

Runs on a GPU machine. Writes a random checkpoint at the Qwen3.5-4B shape in MLX 4-bit
(engine/backends/cuda/synth.py), loads it with the memory limit (default 4 GiB) and reserve
(default 0.5 GiB) at the largest context the plan admits, serves three chat requests (one
longer than max rows, so prefill runs in several windows and a lazy scratch grows), and
compares the most Snug held at once (the pool's peak) with the plan's prediction.

    python3 tools/check_small_card.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from engine.backends.cuda.synth import model_dir
from engine.config import GIB, EngineSettings
from engine.session import Engine, GenerationParams


def planned_bytes(decision) -> int:
    """Everything the decision lets Snug hold at once (weights, states, saved prompts, the
    scratch and workspace at their growth peak)."""
    b = decision.breakdown
    return b.weights + b.stream_state_total + b.prompt_cache + b.scratch_peak + b.workspace_peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4B")
    ap.add_argument("--limit-gib", type=float, default=4.0)
    ap.add_argument("--reserve-gib", type=float, default=0.5)
    ap.add_argument("--prompts", default="48,1500,300", help="prompt lengths of the requests")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--workdir", default="/tmp/snug-bench")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()

    import cupy

    path = model_dir(args.workdir, args.shape, "mlx4")
    settings = EngineSettings(backend="cuda").with_gib(
        reserve=args.reserve_gib, limit=args.limit_gib
    )
    free0, total = cupy.cuda.runtime.memGetInfo()
    t0 = time.perf_counter()
    engine = Engine.load(path, settings, context=None, max_rows=512)
    load_s = time.perf_counter() - t0
    d, be = engine.decision, engine.backend
    print(d.format_table(), flush=True)
    rng = np.random.default_rng(0)
    params = GenerationParams(max_new_tokens=args.new_tokens, greedy=True)
    requests = []
    for n in (int(x) for x in args.prompts.split(",")):
        ids = engine.chat_ids([{"role": "user", "content": "hello"}])
        ids = ids + rng.integers(0, 400, size=max(0, n - len(ids))).tolist()
        events = list(engine.generate(ids, params))
        stats = events[-1].stats
        requests.append(
            {
                "prompt_tokens": stats.prompt_tokens,
                "new_tokens": stats.new_tokens,
                "ttft_s": round(stats.ttft_s, 4),
                "decode_tok_s": round(stats.decode_tok_s, 1),
                "scratch_rows": be.mem_scratch.capacity_rows,
                "held_gib": be.held_bytes() / GIB,
            }
        )
        print(json.dumps(requests[-1]), flush=True)
    free1, _ = cupy.cuda.runtime.memGetInfo()
    planned = planned_bytes(d)
    measured = be.pool.peak_bytes
    result = {
        "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "date": time.strftime("%Y-%m-%d"),
        "shape": args.shape,
        "format": "mlx4",
        "limit_gib": args.limit_gib,
        "reserve_gib": args.reserve_gib,
        "verdict": str(d.verdict),
        "context": d.context,
        "max_rows": d.max_rows,
        "eager": d.eager,
        "load_s": round(load_s, 2),
        "requests": requests,
        "planned_gib": planned / GIB,
        "pool_peak_gib": measured / GIB,
        "peak_over_plan": measured / planned,
        "card_used_by_process_gib": (free0 - free1) / GIB,
        "held_by_category": be.pool.held_by_category(),
    }
    print(
        f"\nverdict {d.verdict}: context {d.context:,}, max rows {d.max_rows}, "
        f"{'eager' if d.eager else 'lazy'} scratch"
    )
    print(
        f"plan {planned / GIB:.3f} GiB; pool peak {measured / GIB:.3f} GiB "
        f"({100 * (measured / planned - 1):+.2f}%); the process's card use "
        f"{(free0 - free1) / GIB:.3f} GiB incl. CUDA context and caches"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "small_card.json").write_text(json.dumps(result, indent=1))
    engine.unload()


if __name__ == "__main__":
    main()
