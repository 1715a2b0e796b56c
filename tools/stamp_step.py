"""Where each projection of a decode step spends its time, from inside the kernels (GPU only).

The decode graph of a random checkpoint at a real shape is captured with `gemv4.cu` compiled
with -DSNUG_STAMPS (kernels/stamps.cuh): thread 0 of every block of every projection notes
the GPU's global clock at entry, when the previous kernel's outputs became readable
(`griddepcontrol.wait` returned), when its activations were staged, after its first tile's
products and at exit. For each replay the projections are put in order and, per kind of
projection (shape, SwiGLU, prologue), the mean over the step of:

    entry    first block's entry - the previous projection's last exit (< 0: started early)
    release  median wait return  - the previous projection's last exit (includes the kernels
             between them, such as the DeltaNet step before out_proj)
    stage    median staging time (activations read, normalised, into shared memory)
    first    median time of the first tile's products
    finish   last exit - median end of the first tile (the other tiles, reductions, stores)
    tail     last exit - median exit (blocks waiting on the slowest)
    span     last exit - the previous projection's last exit: its share of the step

With --late it measures the step again with every projection requesting its first weights
after staging its activations (`Ops.gemv_weights_late`), which tells whether the staging
waits behind those weights. It also times the floor under all of that: a graph of 200
kernels that each wait for the previous one and copy one value per block, launched
overlapped and plainly, at grids of one and two blocks per SM.

    PYTHONPATH=. python3 tools/stamp_step.py --out $OUT   # prints tables, writes stamps.json
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from tools.profile_step import captured_step, prepared_step, step_args

RECORDS = 1 << 16  # SNUG_STAMP_RECORDS in stamps.cuh
FIELDS = ("entry", "release", "stage", "first", "finish", "tail", "span")


def _counters(ops) -> list[tuple]:
    """(record array, counter) device views of every compiled gemv4 module."""
    import cupy

    out = []
    for key, mod in ops._gemv4_mods.items():
        if not isinstance(key, tuple):  # symbol -> kernel entries
            continue
        recs = mod.get_global("snug_stamps")
        n = mod.get_global("snug_nstamps")
        out.append(
            (
                cupy.ndarray((RECORDS, 8), cupy.uint64, memptr=recs),
                cupy.ndarray((1,), cupy.uint32, memptr=n),
            )
        )
    return out


def label(out: int, cols: int, flags: int) -> str:
    pro = flags & 15
    return f"{out}x{cols}" + (" swiglu" if flags & 16 else "") + (f" pro{pro}" if pro else "")


def kernels(records: np.ndarray) -> list[dict]:
    """One entry per projection launch of a replay, in the order they ran."""
    by_w = defaultdict(list)
    for r in records:
        by_w[int(r[0])].append(r)
    ks = []
    for rows in by_w.values():
        a = np.array(rows, np.int64)
        t = a[:, 3:8]
        ks.append(
            {
                "label": label(int(a[0, 1] >> 32), int(a[0, 1] & 0xFFFFFFFF), int(a[0, 2] >> 40)),
                "blocks": len(a),
                "S": t[:, 0].min(),
                "W": np.median(t[:, 1]),
                "X": np.median(t[:, 2]),
                "C": np.median(t[:, 3]),
                "Emed": np.median(t[:, 4]),
                "E": t[:, 4].max(),
            }
        )
    ks.sort(key=lambda k: k["W"])
    return ks


def phases(ks: list[dict]) -> dict[str, dict[str, list]]:
    """Per label, each field's values (ns) over the launches that have a predecessor."""
    agg: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for prev, k in zip(ks[:-1], ks[1:], strict=True):
        a = agg[k["label"]]
        a["entry"].append(k["S"] - prev["E"])
        a["release"].append(k["W"] - prev["E"])
        a["stage"].append(k["X"] - k["W"])
        a["first"].append(k["C"] - k["X"])
        a["finish"].append(k["E"] - k["C"])
        a["tail"].append(k["E"] - k["Emed"])
        a["span"].append(k["E"] - prev["E"])
        a["blocks"].append(k["blocks"])
    return agg


_FLOOR = r"""
extern "C" __global__ void floor_step(const float* x, float* y) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) y[blockIdx.x] = x[blockIdx.x] + 1.f;
}
"""


def boundary_floor(n: int = 200) -> dict[str, float]:
    """us per kernel of a graph of n dependent near-empty kernels (see the module doc)."""
    import cupy

    from engine.backends.cuda.gemv import best_replay_s
    from engine.backends.cuda.launch import launch_pdl, on_stream, sm_count

    fn = cupy.RawModule(code=_FLOOR).get_function("floor_step")
    sms = sm_count()
    bufs = [cupy.zeros(2 * sms, cupy.float32) for _ in range(2)]
    stream = cupy.cuda.Stream(non_blocking=True)
    res = {}
    for per_sm in (1, 2):
        for pdl in (True, False):
            with on_stream(stream):
                stream.begin_capture()
                for i in range(n):
                    a, b = bufs[i % 2], bufs[1 - i % 2]
                    launch_pdl(fn, (per_sm * sms,), (256,), (a, b), 0, pdl=pdl)
                graph = stream.end_capture()
                graph.launch(stream)
                t = best_replay_s(graph, stream, 5)
            res[f"{per_sm}_per_sm_{'overlapped' if pdl else 'plain'}"] = t / n * 1e6
    return res


def measure(be, graphs, views, replays: int) -> tuple[list[float], dict]:
    """Replay the captured step `replays` times; print and return (first entry to last exit
    per replay in us, the mean phases per kind of projection)."""
    agg: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    steps, ticks = [], set()
    for _ in range(replays):
        for _, n in views:
            n.fill(0)
        be.stream.synchronize()
        graphs.replay_next(1)
        be.stream.synchronize()
        recs = np.concatenate([r[: min(int(n.get()[0]), len(r))].get() for r, n in views])
        ticks.update(int(t) % 1000 for t in recs[:, 3:8].ravel()[:4096])
        ks = kernels(recs)
        steps.append((ks[-1]["E"] - ks[0]["S"]) / 1e3)
        for name, fields in phases(ks).items():
            for f, v in fields.items():
                agg[name][f].extend(v)
    late = " (first weights requested late)" if be.ops.gemv_weights_late else ""
    print(
        f"\n{len(ks)} projections per step{late}; first entry to last exit "
        f"{np.median(steps):.1f} us (median of {len(steps)} replays); clock values seen "
        f"modulo 1 us: {len(ticks)} distinct"
    )
    head = "| projection | launches/step | blocks | " + " | ".join(FIELDS) + " |"
    print("\nmean us per launch\n\n" + head + "\n|" + "---|" * (len(FIELDS) + 3))
    table = {}
    for name, fields in sorted(agg.items(), key=lambda kv: -sum(kv[1]["span"])):
        row = {f: float(np.mean(fields[f])) / 1e3 for f in FIELDS}
        row["launches_per_step"] = len(fields["span"]) / replays
        row["blocks"] = float(np.mean(fields["blocks"]))
        table[name] = row
        cells = " | ".join(f"{row[f]:.2f}" for f in FIELDS)
        print(f"| {name} | {row['launches_per_step']:.0f} | {row['blocks']:.0f} | {cells} |")
    return steps, table


def main() -> None:
    ap = step_args(__doc__)
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--out", default=".")
    ap.add_argument(
        "--late", action="store_true", help="again with the first weights requested late"
    )
    args = ap.parse_args()

    from engine.backends.cuda.gemv import GemvMixin

    GemvMixin.gemv4_defines = ("SNUG_STAMPS",)
    be, model, ids = prepared_step(args.shape, args.format, args.prompt, args.workdir, args.replays)
    graphs = captured_step(be, model, ids, args.tuned)
    views = _counters(be.ops)
    report = {"shape": args.shape, "format": args.format}
    print(f"{args.shape} {args.format}")
    for late in (False, True) if args.late else (False,):
        if late:  # the same step with each projection's first weights requested late
            be.ops.gemv_weights_late = True
            graphs.teardown()
            graphs.capture(1)
        steps, table = measure(be, graphs, views, args.replays)
        report["weights_late" if late else "step_us"] = steps
        report["phases_weights_late" if late else "phases"] = table
    floor = boundary_floor()
    cells = ", ".join(f"{k} {v:.2f}" for k, v in floor.items())
    print(f"\nus per near-empty dependent kernel: {cells}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report["floor_us"] = floor
    (Path(args.out) / "stamps.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
