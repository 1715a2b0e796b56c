"""Projection variants chosen by the whole decode step's time (GPU only).

The engine's tuner times each projection shape alone, with the L2 evicted before every
launch. In a decode step the kernels overlap (each one's blocks start, and request their
weights, before the previous one ends), so what is fastest alone need not be fastest there.
This tool loads a random checkpoint at a real shape, captures the decode graph and runs
`DecodeGraphs.tune` over every candidate of every projection shape the step uses
(`--keep` limits it to the fastest ones alone, as the engine's warm-up does with 3): one
shape at a time, each candidate in the recaptured graph, 20 chained replays (best of 2),
a change kept where the step gets faster (coordinate descent, `--passes` rounds). Prints
each shape's choice before and after and the step time; writes tune_step.json to --out.

    PYTHONPATH=. python3 tools/tune_step.py --out $OUT
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tools.profile_step import captured_step, prepared_step, step_args


def main() -> None:
    ap = step_args(__doc__)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--keep", type=int, default=0, help="candidates per shape (0: all)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()

    be, model, ids = prepared_step(args.shape, args.format, args.prompt, args.workdir, 8)
    graphs = captured_step(be, model, ids, args.tuned)
    ops = be.ops
    keys = graphs.keys[1]
    start = {k: ops.gemv_choice[k] for k in keys}
    t0 = time.perf_counter()
    base, after = graphs.tune(1, keep=args.keep or None, passes=args.passes, gain=0.0)
    print(
        f"{args.shape} {args.format}: step {base * 1e3:.3f} -> {after * 1e3:.3f} ms "
        f"({1 / base:.0f} -> {1 / after:.0f} tok/s), {time.perf_counter() - t0:.0f} s of search"
    )
    print("\n| shape key | tuner alone | whole step |\n|---|---|---|")
    for key in keys:
        print(f"| {key} | {start[key]} | {ops.gemv_choice[key]} |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report = {
        "shape": args.shape,
        "format": args.format,
        "step_ms_tuner": base * 1e3,
        "step_ms_best": after * 1e3,
        "tuner": {str(k): list(start[k]) for k in keys},
        "best": {str(k): list(ops.gemv_choice[k]) for k in keys},
    }
    (Path(args.out) / "tune_step.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
