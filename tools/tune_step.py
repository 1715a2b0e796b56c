"""Projection variants chosen by the whole decode step's time (GPU only).

The engine's tuner times each projection shape alone, with the L2 evicted before every
launch. In a decode step the kernels overlap (each one's blocks start, and request their
weights, before the previous one ends), so what is fastest alone need not be fastest there.
This tool loads a random checkpoint at a real shape, captures the decode graph, and then, one
projection shape at a time, tries every variant the tuner may pick, recaptures the graph and
times 30 replays from the same position (best of 3). It keeps a change when the step gets
faster (coordinate descent, `--passes` rounds), prints each shape's choice before and after
and the step time, and writes tune_step.json to --out.

    PYTHONPATH=. python3 tools/tune_step.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from tools.profile_step import captured_step, prepared_step


def step_seconds(be, graphs, position: int, replays: int = 30, rounds: int = 3) -> float:
    """Seconds per decode step: the best of `rounds` runs of `replays` steps from `position`."""
    import cupy

    from engine.backends.base import Batch

    best = float("inf")
    for _ in range(rounds):
        graphs.replay(Batch.step([(0, position)]), np.array([5]))
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(be.stream)
        for _ in range(replays):
            graphs.replay_next(1)
        e1.record(be.stream)
        e1.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / 1e3 / replays)
    return best


def candidates(ops, key: tuple) -> list[tuple]:
    """What the tuner may pick for a choice key (bits, rows, out, in, swiglu, prologue)."""
    _, rows, n_out, cols, swiglu, kind = key
    x = SimpleNamespace(shape=(rows, cols))
    w = SimpleNamespace(shape=(n_out, cols))
    from engine.backends.cuda.gemv import GEMV4_VARIANTS

    cands = [("mma", *v) for v in GEMV4_VARIANTS if ops._gemv4_fits(x, w, v)]
    if not ops.staged_gemv:
        cands = [c for c in cands if not c[5]]
    return cands


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4B")
    ap.add_argument("--format", default="mlx4", choices=("mlx4", "bf16"))
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--workdir", default="/tmp/snug-profile")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()

    from engine.backends.base import Batch

    be, model, ids = prepared_step(args.shape, args.format, args.prompt, args.workdir, 8)
    ops, P = be.ops, args.prompt
    used: list[tuple] = []  # the choice keys the decode step looks up, in order
    key_of = ops.gemv_key
    ops.gemv_key = lambda *a: (lambda k: used.append(k) or k)(key_of(*a))
    graphs = captured_step(be, model, ids)
    del ops.gemv_key
    keys = [k for k in dict.fromkeys(used) if k[0] == 4 and ops.gemv_choice[k][0] == "mma"]

    def recapture() -> None:
        model.forward(Batch.step([(0, P)]), np.array([5]))  # new variants set up eagerly
        graphs.teardown()
        graphs.capture(1)

    start = dict(ops.gemv_choice)
    base = step_seconds(be, graphs, P)
    best_t = base
    print(f"{args.shape} {args.format}: step {base * 1e3:.3f} ms with the tuner's choices")
    trials = []
    t0 = time.perf_counter()
    for p in range(args.passes):
        for key in keys:
            for cand in candidates(ops, key):
                if cand == ops.gemv_choice[key]:
                    continue
                keep = ops.gemv_choice[key]
                ops.gemv_choice[key] = cand
                recapture()
                t = step_seconds(be, graphs, P)
                trials.append({"pass": p, "key": str(key), "variant": list(cand), "ms": t * 1e3})
                if t < best_t:
                    best_t = t
                else:
                    ops.gemv_choice[key] = keep
            print(f"pass {p} {key}: {ops.gemv_choice[key]} -> step {best_t * 1e3:.3f} ms")
    recapture()
    final = step_seconds(be, graphs, P)
    print(
        f"step {base * 1e3:.3f} -> {final * 1e3:.3f} ms ({1 / base:.0f} -> {1 / final:.0f} tok/s),"
        f" {time.perf_counter() - t0:.0f} s of search"
    )
    print("\n| shape key | tuner alone | whole step |\n|---|---|---|")
    for key in keys:
        print(f"| {key} | {start[key]} | {ops.gemv_choice[key]} |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report = {
        "shape": args.shape,
        "format": args.format,
        "step_ms_tuner": base * 1e3,
        "step_ms_best": final * 1e3,
        "tuner": {str(k): list(start[k]) for k in keys},
        "best": {str(k): list(ops.gemv_choice[k]) for k in keys},
        "trials": trials,
    }
    (Path(args.out) / "tune_step.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
