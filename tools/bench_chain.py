"""Projection chains as a decode step runs them (CUDA backend, GPU only).

A 4B DeltaNet layer's four projections (input group 12352x2560, out_proj 2560x4096, gate/up
2x9216x2560 with SwiGLU, down 2560x9216), each reading the previous one's output, repeated
for 24 layers with distinct random MLX 4-bit weights (1.5 GB, so nothing stays in L2),
captured as one CUDA graph with programmatic dependent launch on and replayed. A per-launch
tuner times each kernel alone; here the variants are chosen by coordinate descent on the
whole chain's time, which is what a decode step pays. Prints both and writes
chain_bench.json to --out.

    PYTHONPATH=. python3 tools/bench_chain.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine.backends.cuda.gemv import best_replay_s
from engine.backends.cuda.launch import on_stream
from engine.backends.cuda.ops import Ops
from tools.bench_gemv import make_weight

LAYERS = 24
# name, out, in, swiglu
CHAIN = [
    ("in_proj", 12352, 2560, False),
    ("out_proj", 2560, 4096, False),
    ("gate/up", 9216, 2560, True),
    ("down", 2560, 9216, False),
]


def build(ops: Ops):
    import cupy

    layers = []
    for li in range(LAYERS):
        ws = []
        for k, (_, n_out, cols, swiglu) in enumerate(CHAIN):
            w = make_weight(ops, n_out, cols, 1000 * li + 2 * k)
            up = make_weight(ops, n_out, cols, 1000 * li + 2 * k + 1) if swiglu else None
            ws.append((w, up))
        layers.append(ws)
    bufs = {
        "x": cupy.zeros((1, 2560), ops.act_dtype),
        "a": cupy.zeros((1, 12352), ops.act_dtype),
        "b": cupy.zeros((1, 2560), ops.act_dtype),
        "c": cupy.zeros((1, 9216), ops.act_dtype),
    }
    return layers, bufs


def chain_time(ops: Ops, layers, bufs, choices: list, reps: int = 10) -> float:
    """Seconds per layer of the 24-layer chain with the given variant per position."""
    import cupy

    flow = [("x", "a"), ("a4096", "b"), ("b", "c"), ("c", "x")]
    stream = cupy.cuda.Stream(non_blocking=True)
    with on_stream(stream):
        for _ in range(2):  # compile and warm outside the capture
            _launch_chain(ops, layers, bufs, choices, flow)
        stream.synchronize()
        ops.graphing = True
        try:
            stream.begin_capture()
            _launch_chain(ops, layers, bufs, choices, flow)
            graph = stream.end_capture()
        finally:
            ops.graphing = False
        graph.launch(stream)
        stream.synchronize()
        best = best_replay_s(graph, stream, reps)
    return best / LAYERS


def _launch_chain(ops, layers, bufs, choices, flow) -> None:
    for ws in layers:
        for (w, up), choice, (src, dst) in zip(ws, choices, flow, strict=True):
            x = bufs["a"][:, :4096] if src == "a4096" else bufs[src]
            ops.gemv_run(choice, x, w, bufs[dst], up)


def main() -> None:
    import cupy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    ops = Ops("bfloat16")
    layers, bufs = build(ops)
    cands = []
    tuned = []
    for k in range(len(CHAIN)):
        w, up = layers[0][k]
        x = bufs["a"][:, :4096] if k == 1 else bufs[["x", "a", "b", "c"][k]]
        cs = ops.gemv_candidates(x, w, up)
        cands.append(cs)
        times = [ops.time_gemv(c, x, w, cupy.empty((1, w.shape[0]), ops.act_dtype), up) for c in cs]
        tuned.append(cs[times.index(min(times))])
    ideal_bytes = sum(
        n * c // 2 * (2 if sw else 1) + n * c // 64 * 4 * (2 if sw else 1) for _, n, c, sw in CHAIN
    )
    report = {"tuned": [list(c) for c in tuned]}
    t0 = chain_time(ops, layers, bufs, tuned)
    report["tuned_us_per_layer"] = t0 * 1e6
    print(f"per-launch tuner's choice: {t0 * 1e6:.1f} us/layer ({ideal_bytes / t0 / 1e9:.0f} GB/s)")

    best, best_t = list(tuned), t0
    trials = []
    start = time.perf_counter()
    for p in range(args.passes):
        for k in range(len(CHAIN)):
            for c in cands[k]:
                trial = list(best)
                trial[k] = c
                t = chain_time(ops, layers, bufs, trial, reps=5)
                trials.append(
                    {"pass": p, "position": CHAIN[k][0], "variant": list(c), "us": t * 1e6}
                )
                if t < best_t:
                    best, best_t = trial, t
            print(f"pass {p} {CHAIN[k][0]}: best {best[k]} -> {best_t * 1e6:.1f} us/layer")
    report.update(
        chain_best=[list(c) for c in best],
        chain_best_us_per_layer=best_t * 1e6,
        ideal_bytes_per_layer=ideal_bytes,
        gb_s_tuned=ideal_bytes / t0 / 1e9,
        gb_s_best=ideal_bytes / best_t / 1e9,
        search_s=time.perf_counter() - start,
        trials=trials,
        pdl=ops.pdl,
    )
    print(
        f"chain-tuned: {best_t * 1e6:.1f} us/layer ({ideal_bytes / best_t / 1e9:.0f} GB/s); "
        f"variants {best}"
    )
    for frac in (0.75, 0.5):  # grids smaller than the GPU holds: room for the next kernel
        ops.gemv_wave_fraction = frac
        t = chain_time(ops, layers, bufs, best)
        report[f"wave_fraction_{frac}_us"] = t * 1e6
        print(f"grids at {frac} of resident capacity: {t * 1e6:.1f} us/layer")
    ops.gemv_wave_fraction = 1.0
    ops.pdl = False
    t_plain = chain_time(ops, layers, bufs, best)
    report["chain_best_plain_launches_us"] = t_plain * 1e6
    print(f"same variants, plain launches: {t_plain * 1e6:.1f} us/layer")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "chain_bench.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
