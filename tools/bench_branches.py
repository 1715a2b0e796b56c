"""Whether a decode step's MLP runs faster as two independent halves on two streams of one
graph than as one gate/up and one down (CUDA backend, GPU only; kernel-level figures).

Each layer's MLP (MLX 4-bit, `gemv4` with SwiGLU, then down) is captured five ways, over
as many layers as the model has, each layer with its own weights so that they stream from
device memory:

    serial     gate/up -> down, one stream (as the engine runs it)
    halves     gate/up A -> down A -> gate/up B -> down B, one stream: each half has half
               the intermediate rows (and down half the columns)
    branches   the two halves' chains on two streams, forked from and joined into the main
               one at every layer: neither half waits for the other until the join
    capped     as branches, each launch's grid capped at half of what the GPU holds at once
    tail       gate/up A -> down A on the main stream beside gate/up B on the other; down B
               after the join (where it would add down A's sums to its own)

Launches use programmatic dependent launch, as the decode graph does. Each kernel's variant is
the one chosen for its shape timed alone (`Projections.gemv`). Prints microseconds a layer
(the fastest of several replays) and writes branches.json to --out.

    PYTHONPATH=. python3 tools/bench_branches.py --sizes 4B,0.8B --out $OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from engine.memory.shapes import shape_config
from tools.bench_gemv import make_weight, to_act

MODES = ("serial", "halves", "branches", "capped", "tail")


class Layer:
    """One layer's MLP weights, whole and in halves, and its output buffers."""

    def __init__(self, ops: Any, hidden: int, inter: int, seed: int) -> None:
        import cupy

        half = inter // 2
        self.gate = make_weight(ops, inter, hidden, seed)
        self.up = make_weight(ops, inter, hidden, seed + 1)
        self.down = make_weight(ops, hidden, inter, seed + 2)
        self.halves = [
            (
                make_weight(ops, half, hidden, seed + 3 + 3 * i),
                make_weight(ops, half, hidden, seed + 4 + 3 * i),
                make_weight(ops, hidden, half, seed + 5 + 3 * i),
            )
            for i in range(2)
        ]
        act = ops.k.act_dtype
        self.h = cupy.zeros((1, inter), act)
        self.y = cupy.zeros((1, hidden), act)
        self.hh = [cupy.zeros((1, half), act) for _ in range(2)]
        self.yy = [cupy.zeros((1, hidden), act) for _ in range(2)]


def run_layer(ops: Any, mode: str, x: Any, lay: Layer, side: Any, main: Any) -> None:
    """Launch one layer's MLP in `mode` on `main` (and `side` for the branches)."""
    import cupy

    from engine.backends.cuda.launch import on_stream

    if mode == "serial":
        ops.gemv(x, lay.gate, lay.h, up=lay.up)
        ops.gemv(lay.h, lay.down, lay.y)
        return
    if mode == "halves":
        for (g, u, d), h, y in zip(lay.halves, lay.hh, lay.yy, strict=True):
            ops.gemv(x, g, h, up=u)
            ops.gemv(h, d, y)
        return
    fork = cupy.cuda.Event(disable_timing=True)
    fork.record(main)
    side.wait_event(fork)
    (g0, u0, d0), (g1, u1, d1) = lay.halves
    ops.gemv(x, g0, lay.hh[0], up=u0)
    with on_stream(side):
        ops.gemv(x, g1, lay.hh[1], up=u1)
    ops.gemv(lay.hh[0], d0, lay.yy[0])
    with on_stream(side):
        if mode != "tail":
            ops.gemv(lay.hh[1], d1, lay.yy[1])
        join = cupy.cuda.Event(disable_timing=True)
        join.record(side)
    main.wait_event(join)
    if mode == "tail":
        ops.gemv(lay.hh[1], d1, lay.yy[1])


def measure(ops: Any, mode: str, x: Any, layers: list[Layer], reps: int) -> float:
    """Microseconds a layer: the fastest replay of a graph of every layer in `mode`."""
    import cupy

    from engine.backends.cuda.launch import on_stream
    from engine.backends.cuda.projection_tuning import best_replay_s

    main = cupy.cuda.Stream(non_blocking=True)
    side = cupy.cuda.Stream(non_blocking=True)
    resident = ops._gemv4_resident
    if mode == "capped":
        ops._gemv4_resident = lambda fn, t, s: max(1, resident(fn, t, s) // 2)
    try:
        with on_stream(main):
            # each shape tuned alone, outside the capture
            run_layer(ops, "serial" if mode == "serial" else "halves", x, layers[0], side, main)
            main.synchronize()
            ops.k.graphing = True
            main.begin_capture()
            for lay in layers:
                run_layer(ops, mode, x, lay, side, main)
            graph = main.end_capture()
            ops.k.graphing = False
            graph.launch(main)
            main.synchronize()
            best = best_replay_s(graph, main, reps)
    finally:
        ops.k.graphing = False
        ops._gemv4_resident = resident
    return best * 1e6 / len(layers)


def bench_size(ops: Any, size: str, reps: int) -> dict:
    import cupy

    cfg = shape_config(size, "mlx4")
    hidden, inter, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    layers = [Layer(ops, hidden, inter, 100 * i) for i in range(n)]
    x = to_act(ops, cupy.random.RandomState(7).standard_normal((1, hidden)).astype(cupy.float32))
    row: dict[str, Any] = {"size": size, "hidden": hidden, "intermediate": inter, "layers": n}
    outs = {}
    for mode in MODES:
        row[mode] = measure(ops, mode, x, layers, reps)
        outs[mode] = [cupy.asnumpy(y).copy() for y in layers[-1].yy]
        print(f"{size} {mode}: {row[mode]:.2f} us a layer", flush=True)
    # the branch graphs run the same kernels on the same inputs as the halves
    row["same_outputs"] = all(
        (a == b).all()
        for m in ("branches", "capped", "tail")
        for a, b in zip(outs["halves"], outs[m], strict=True)
    )
    mb = sum(w.nbytes for w in (layers[0].gate, layers[0].up, layers[0].down)) / 1e6
    row["weight_mb_a_layer"] = mb
    del layers
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4B,0.8B")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    import cupy

    from engine.backends.cuda.launch import Kernels
    from engine.backends.cuda.projections import Projections
    from engine.testing.receipt import commit

    ops = Projections(Kernels("bfloat16"))
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = [bench_size(ops, s, args.reps) for s in args.sizes.split(",") if s]
    meta = {"gpu": gpu, "commit": commit(), "date": time.strftime("%Y-%m-%d")}
    print(f"\nKernel-level, {gpu}, {meta['commit']}, {meta['date']}: us a layer's MLP")
    print("| size | MB a layer | " + " | ".join(MODES) + " | same outputs |")
    print("| --- | --- |" + " --- |" * (len(MODES) + 1))
    for r in rows:
        cells = " | ".join(f"{r[m]:.2f}" for m in MODES)
        print(f"| {r['size']} | {r['weight_mb_a_layer']:.1f} | {cells} | {r['same_outputs']} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "branches.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
