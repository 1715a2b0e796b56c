"""Benchmark: is the first request as fast as later ones (no growth, no capture on it)?

Runs on a GPU machine, no memory limit. Loads a random 4B-shape MLX 4-bit checkpoint
(eager path: the whole scratch is allocated and every decode graph captured at warm-up),
then serves the same kind of request several times: a long prompt (default 16K tokens)
followed by greedy decode. Prints decode tokens/s of each request and the first one's ratio
to the later ones' mean (the review thread saw 0.67x when growth and capture fell on a real
request). Writes first_request.json.

    python3 tools/bench_first_request.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from engine.backends.cuda.synth import model_dir
from engine.config import EngineSettings
from engine.session import Engine, GenerationParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4B")
    ap.add_argument("--prompt", type=int, default=16384)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--workdir", default="/tmp/snug-bench")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()

    import cupy

    path = model_dir(args.workdir, args.shape, "mlx4")
    engine = Engine.load(
        path,
        EngineSettings(backend="cuda"),
        context=args.prompt + args.new_tokens + 64,
        max_rows=512,
    )
    print(engine.decision.format_table(), flush=True)
    rng = np.random.default_rng(0)
    params = GenerationParams(max_new_tokens=args.new_tokens, greedy=True)
    rows = []
    for i in range(args.requests):
        ids = rng.integers(0, 400, size=args.prompt).tolist()  # fresh: no prompt-cache hit
        t = time.perf_counter()
        stats = list(engine.generate(ids, params))[-1].stats
        rows.append(
            {
                "request": i + 1,
                "prompt_tokens": stats.prompt_tokens,
                "new_tokens": stats.new_tokens,
                "ttft_s": round(stats.ttft_s, 3),
                "prefill_tok_s": round(stats.prefill_tok_s),
                "decode_tok_s": round(stats.decode_tok_s, 1),
                "total_s": round(time.perf_counter() - t, 3),
                "scratch_rows": engine.backend.mem_scratch.capacity_rows,
                "graphs": sorted(engine.backend.graphs.graphs),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    later = [r["decode_tok_s"] for r in rows[1:]]
    ratio = rows[0]["decode_tok_s"] / (sum(later) / len(later))
    result = {
        "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "date": time.strftime("%Y-%m-%d"),
        "shape": args.shape,
        "format": "mlx4",
        "eager": engine.decision.eager,
        "requests": rows,
        "first_over_later": ratio,
    }
    print("\n| request | prompt | TTFT s | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['request']} | {r['prompt_tokens']} | {r['ttft_s']} | "
            f"{r['prefill_tok_s']} | {r['decode_tok_s']} |"
        )
    print(f"\nfirst request decode / later requests' mean: {ratio:.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_request.json").write_text(json.dumps(result, indent=1))
    engine.unload()


if __name__ == "__main__":
    main()
