"""Where a prompt's time to first token goes (GPU only), on the app's own path.

Loads a random checkpoint at a real shape through `Engine.load` (a memory limit simulating
the card, if given), runs one prompt to warm every kernel, then traces a second, fresh
prompt of the same length through `Engine.generate` (one new token) with CUPTI, as torch's
profiler drives it. Prints the wall time to the first token, the time some kernel was
running, the gaps where none was, and the kernels by family (launches, total and share).
These are kernel figures for finding where time goes, not the product's speed (that is
tools/bench_decode.py --first-request / --small-card).

    PYTHONPATH=. python3 tools/profile_prefill.py --shape 4B --format mlx4 --prompt 8000
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tools.profile_step import family


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by at least one of the (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def fold(kernels: list[tuple[str, float, float]]) -> list[tuple[str, int, float]]:
    """(family, launches, total microseconds) from (name, start, duration), largest first."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, _, dur in kernels:
        a = acc[family(name)]
        a[0] += 1
        a[1] += dur
    return sorted(((k, int(n), t) for k, (n, t) in acc.items()), key=lambda r: -r[2])


def table(wall_s: float, kernels: list[tuple[str, float, float]], top: int = 25) -> str:
    spans = [(s, s + d) for _, s, d in kernels]
    busy = busy_time(spans)
    first, last = (min(s for s, _ in spans), max(e for _, e in spans)) if spans else (0, 0)
    lines = [
        f"time to first token (wall): {wall_s * 1e3:.1f} ms; kernels from first start to last "
        f"end: {(last - first) / 1e3:.1f} ms; some kernel running: {busy / 1e3:.1f} ms; "
        f"no kernel running inside that span: {(last - first - busy) / 1e3:.1f} ms",
        "",
        "| kernel family | launches | total ms | share of kernel time |",
        "| --- | --- | --- | --- |",
    ]
    rows = fold(kernels)
    whole = sum(t for _, _, t in rows) or 1.0
    for name, n, t in rows[:top]:
        lines.append(f"| `{name[:70]}` | {n} | {t / 1e3:.2f} | {100 * t / whole:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4B")
    ap.add_argument("--format", default="mlx4", choices=("mlx4", "bf16"))
    ap.add_argument("--prompt", type=int, default=8000)
    ap.add_argument("--max-rows", type=int, default=None, help="default: the plan's")
    ap.add_argument("--limit-gib", type=float, default=None, help="simulate a card this size")
    ap.add_argument("--workdir", default="/tmp/snug-bench")
    ap.add_argument("--out", default=None, help="write the folded table as JSON here")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.config import EngineSettings
    from engine.session import Engine, GenerationParams
    from engine.testing.synth import model_dir

    settings = EngineSettings(backend="cuda")
    if args.limit_gib:
        settings = settings.with_gib(reserve=0.5, limit=args.limit_gib)
    context = None if args.limit_gib else args.prompt + 64
    engine = Engine.load(
        model_dir(args.workdir, args.shape, args.format),
        settings,
        context=context,
        max_rows=args.max_rows,
    )
    print(engine.decision.format_table() if engine.decision else "", flush=True)
    rng = np.random.default_rng(1)
    params = GenerationParams(max_new_tokens=1, greedy=True)
    list(engine.generate(rng.integers(0, 400, args.prompt).tolist(), params))  # warm
    ids = rng.integers(0, 400, args.prompt).tolist()  # fresh: no prompt-cache hit
    torch.cuda.init()
    trace = Path("/tmp/snug-prefill-trace.json")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        list(engine.generate(ids, params))
        wall = time.perf_counter() - t
        engine.backend.stream.synchronize()
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [
        (e["name"], float(e["ts"]), float(e["dur"])) for e in events if e.get("cat") == "kernel"
    ]
    print(table(wall, kernels), flush=True)
    if args.out:
        rows = [{"family": f, "launches": n, "total_us": t} for f, n, t in fold(kernels)]
        Path(args.out).write_text(json.dumps({"wall_s": wall, "families": rows}, indent=1))
    engine.unload()


if __name__ == "__main__":
    main()
