"""Where one decode step's time goes (GPU only): per kernel, on a timeline, inside projections.

Loads a random checkpoint at a real shape, runs a prompt and two warm-up steps (every kernel
compiled and tuned), then one eager decode step between cudaProfilerStart/Stop. Under
Nsight Compute each kernel of that step is timed on its own; `--summary` folds the CSV into
a table of kernel families (launches, total and mean microseconds).

    ncu --profile-from-start off --cache-control none --metrics gpu__time_duration.sum \\
        --csv python3 tools/profile_step.py > ncu.csv
    python3 tools/profile_step.py --summary ncu.csv

`--metrics` may also ask for the memory metrics in METRICS below; the table then gains their
columns (tools/device_check.sh profile asks for all of them).

With `--graph N` the profiled range is N replays of the captured decode graph instead, as a
decode runs; Nsight Systems traces each kernel node where it really starts and ends (with
overlapped launches, kernels overlap), and `--timeline` folds its trace into the same table
plus the step's span and how much of it no kernel was running:

    nsys profile --capture-range=cudaProfilerApi --cuda-graph-trace=node -o step \\
        python3 tools/profile_step.py --graph 20
    nsys stats --report cuda_gpu_trace --format csv --output trace step.nsys-rep
    python3 tools/profile_step.py --timeline trace_cuda_gpu_trace.csv --graph 20

With `--stamps` the decode graph is captured with `gemv4.cu` compiled with -DSNUG_STAMPS
(kernels/stamps.cuh): thread 0 of every block of every projection notes the GPU's global
clock at entry, when the previous kernel's outputs became readable (`griddepcontrol.wait`
returned), when the prologue's barrier let its staging start, when its own first staged
entry was loaded and folded, when its activations were staged, after its first tile's
products and at exit.
For each replay the projections are put in order and, per kind of projection (shape,
SwiGLU, prologue; the variant it ran as, warps a tile / tiles a block / groups a load, 'p'
if pipelined, and threads a block), the mean over the step of:

    entry    first block's entry - the previous projection's last exit (< 0: started early)
    release  median wait return  - the previous projection's last exit (includes the kernels
             between them, such as the DeltaNet step before out_proj)
    ready    median start of the staging - median wait return (the prologue's norm weight
             and a barrier; none for a plain input)
    loaded   median load and fold of thread 0's first entry - median start of the staging
    stage    median staging time (activations read, normalised, into shared memory), from
             the wait's return: ready, loaded, and the rest of the entries and barrier
    first    median time of the first tile's products
    finish   last exit - median end of the first tile (the other tiles, reductions, stores)
    tail     last exit - median exit (blocks waiting on the slowest)
    span     last exit - the previous projection's last exit: its share of the step

    python3 tools/profile_step.py --stamps --tuned --out $OUT   # tables, stamps.json

(`--graph N` sets the replays measured, 10 by default. With `--graph` or `--stamps`,
`--tuned` first re-chooses the projections by the step's own time, as the app's load does.)
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np


def cupti_trace(work, be, csv_path: str) -> None:
    """Where Nsight Systems is missing: trace `work`'s kernels through CUPTI as torch's
    profiler drives it (it records every kernel of the process, graph nodes included) and
    write them as the `nsys stats` cuda_gpu_trace CSV that `--timeline` reads."""
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        be.stream.synchronize()
    prof.export_chrome_trace(csv_path + ".json")
    events = json.load(open(csv_path + ".json"))["traceEvents"]
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Start (ns)", "Duration (ns)", "Name"])
        for e in events:
            if e.get("cat") == "kernel":
                w.writerow([round(float(e["ts"]) * 1e3), round(float(e["dur"]) * 1e3), e["name"]])


def step_args(description: str) -> argparse.ArgumentParser:
    """A parser with the arguments every decode-step tool takes: the model's shape and
    format, the prompt length and where its random checkpoint is written."""
    ap = argparse.ArgumentParser(description=description.splitlines()[0])
    ap.add_argument("--shape", default="4B")
    ap.add_argument("--format", default="mlx4", choices=("mlx4", "bf16"))
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--workdir", default="/tmp/snug-profile")
    ap.add_argument(
        "--tuned", action="store_true", help="projections re-chosen by the step's own time first"
    )
    return ap


def prepared_step(shape: str, fmt: str, prompt: int, workdir: str, steps: int) -> tuple:
    """(backend, model, prompt ids): a random checkpoint at a real shape, loaded on the GPU,
    after a prompt and two eager steps (every kernel compiled and tuned), with room for
    `steps` more."""
    from engine.backends.base import Batch
    from engine.backends.cuda.backend import CudaBackend
    from engine.checkpoint.checkpoint import Checkpoint
    from engine.models.qwen35 import Qwen35Model
    from engine.testing.synth import write_checkpoint

    path = write_checkpoint(Path(workdir) / f"{shape}-{fmt}", shape, fmt, seed=1)
    ck = Checkpoint.open(path)
    be = CudaBackend(dtype="bfloat16")
    model = Qwen35Model(ck.config, be, be.load_weights(ck, ck.config))
    be.alloc_state(ck.config, 1, prompt + 8 + steps)
    ids = np.random.default_rng(1).integers(0, 1000, prompt)
    model.forward(Batch.window(0, 0, prompt), ids)
    for i in range(2):
        model.forward(Batch.step([(0, prompt + i)]), np.array([5]))
    be.stream.synchronize()
    return be, model, ids


def captured_step(be, model, ids, tuned: bool = False) -> object:
    """The decode graph of one stream, captured (tuned: with the projections the app runs on
    a large card, re-chosen by the step's own time), after the prompt again (capture's
    warm-up step and the tuning write slot 0) and one replay; `replay_next(1)` then decodes
    on."""
    from engine.backends.base import Batch
    from engine.backends.cuda.graphs import DecodeGraphs

    graphs = DecodeGraphs(be, model)
    graphs.capture(1)
    if tuned:
        graphs.tune(1)
    model.forward(Batch.window(0, 0, len(ids)), ids)
    graphs.replay(Batch.step([(0, len(ids))]), np.array([5]))
    be.stream.synchronize()
    return graphs


def run_step(
    shape: str,
    fmt: str,
    prompt: int,
    workdir: str,
    replays: int = 0,
    torch_trace: str = "",
    tuned: bool = False,
) -> None:
    import cupy

    from engine.backends.base import Batch

    be, model, ids = prepared_step(shape, fmt, prompt, workdir, replays)
    if replays:
        graphs = captured_step(be, model, ids, tuned)
        if torch_trace:
            cupti_trace(lambda: [graphs.replay_next(1) for _ in range(replays)], be, torch_trace)
            return
        cupy.cuda.profiler.start()
        for _ in range(replays):
            graphs.replay_next(1)
        be.stream.synchronize()
        cupy.cuda.profiler.stop()
        return
    cupy.cuda.profiler.start()
    model.forward(Batch.step([(0, prompt + 2)]), np.array([5]))
    be.stream.synchronize()
    cupy.cuda.profiler.stop()


def family(name: str) -> str:
    """A kernel's base name; gemv4 keeps its template arguments (rows, swiglu, ..., prologue),
    since its variants are what a step chooses between."""
    name = name.removeprefix("void ").strip()
    base = re.split(r"[<(]", name, maxsplit=1)[0]
    if base == "gemv4" and "<" in name:
        return name[: name.index(">") + 1]
    return base


# Memory metrics `summary` reads besides the time, where the CSV has them
# (tools/device_check.sh profile asks for all of them): what each kernel read from device
# memory, its DRAM throughput as a share of the peak, and its L2 hit rate.
METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
)
_SCALE = {
    "ns": 1e-3,
    "nsecond": 1e-3,
    "us": 1.0,
    "usecond": 1.0,
    "ms": 1e3,
    "msecond": 1e3,
    "byte": 1.0,
    "Kbyte": 1e3,
    "Mbyte": 1e6,
    "Gbyte": 1e9,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "%": 1.0,
}


def summary(csv_path: str) -> str:
    """The table of kernel families from an `ncu --csv` file (printed and returned): with
    the memory metrics, also MB read per launch, the GB/s that makes, the DRAM throughput's
    share of its peak and the L2 hit rate (means over launches)."""
    launches: dict[str, dict] = defaultdict(dict)
    with open(csv_path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for rec in csv.DictReader(lines):
        metric = rec.get("Metric Name")
        if metric not in METRICS:
            continue
        value = float(rec["Metric Value"].replace(",", "")) * _SCALE[rec["Metric Unit"]]
        launch = launches[rec["ID"]]
        launch["family"] = family(rec["Kernel Name"])
        launch[metric] = value
    rows = defaultdict(list)
    for launch in launches.values():
        if METRICS[0] in launch:
            rows[launch["family"]].append(launch)
    mem = any(METRICS[1] in ln for v in rows.values() for ln in v)
    total = sum(ln[METRICS[0]] for v in rows.values() for ln in v)
    head = "| kernel | launches | total us | mean us | share |"
    if mem:
        head += " MB read | GB/s | DRAM % of peak | L2 hit % |"
    out = [head, "|" + "---|" * head.count(" | ")]

    def mean(v: list, key: str) -> float:
        return float(np.mean([ln.get(key, np.nan) for ln in v]))

    for name, v in sorted(rows.items(), key=lambda kv: -sum(ln[METRICS[0]] for ln in kv[1])):
        us = sum(ln[METRICS[0]] for ln in v)
        line = f"| {name} | {len(v)} | {us:.1f} | {us / len(v):.2f} | {us / total:.1%} |"
        if mem:
            nbytes = sum(ln.get(METRICS[1], 0.0) for ln in v)
            line += (
                f" {nbytes / len(v) / 1e6:.2f} | {nbytes / us / 1e3:.0f} |"
                f" {mean(v, METRICS[2]):.1f} | {mean(v, METRICS[3]):.1f} |"
            )
        out.append(line)
    out.append(f"| all | {sum(len(v) for v in rows.values())} | {total:.1f} | - | - |")
    if mem:
        out[-1] += " - | - | - | - |"
    text = "\n".join(out)
    print(text)
    return text


def write_sequence(named: list, replays: int, path: str) -> None:
    """The middle replay's kernels in order: start from the step's first kernel, duration,
    and the gap after the previous kernel ended (negative where they overlap)."""
    per = len(named) // replays
    step = named[per * (replays // 2) : per * (replays // 2 + 1)]
    with open(path, "w") as f:
        f.write("kernel,start_us,duration_us,gap_us\n")
        prev_end = step[0][0]
        for a, b, name in step:
            t0, dur, gap = (a - step[0][0]) / 1e3, (b - a) / 1e3, (a - prev_end) / 1e3
            f.write(f"{name},{t0:.2f},{dur:.2f},{gap:.2f}\n")
            prev_end = max(prev_end, b)


def step_shares(named: list, replays: int) -> dict[str, float]:
    """Per kernel family, microseconds a step it accounts for: each kernel's end past the
    latest end before it (0 where an earlier kernel outlasts it; the first kernel of a replay
    from its start). Summed over the families this is a replay's span, first start to last
    end; with overlapped launches it says what a kernel added, where durations overlap."""
    named = sorted(named)
    per = len(named) // replays
    out: dict[str, float] = defaultdict(float)
    for r in range(replays):
        step = named[r * per : (r + 1) * per]
        end = step[0][0]
        for _, b, name in step:
            out[name] += max(0.0, b - end) / 1e3 / replays
            end = max(end, b)
    return out


def timeline(csv_path: str, replays: int, sequence: str | None = None) -> None:
    """Fold an `nsys stats` cuda_gpu_trace CSV of `replays` graph replays into per-family
    in-graph times per step, each family's share of the step (`step_shares`), and the step's
    span against the time some kernel was running."""
    rows, named = defaultdict(list), []
    with open(csv_path, newline="") as f:
        for rec in csv.DictReader(f):
            name = rec.get("Name", "")
            if "[CUDA mem" in name or not rec.get("Start (ns)"):
                continue
            t0, dt = float(rec["Start (ns)"]), float(rec["Duration (ns)"])
            named.append((t0, t0 + dt, family(name)))
            rows[family(name)].append(dt / 1e3)
    if not named:
        raise SystemExit(f"{csv_path}: no kernels in the trace")
    named.sort()
    spans = [(a, b) for a, b, _ in named]
    busy, end = 0.0, spans[0][0]
    for a, b in spans:  # union of the kernels' intervals (overlapped launches overlap)
        if b > end:
            busy += b - max(a, end)
            end = b
    span = (spans[-1][1] - spans[0][0]) / 1e3
    total = sum(sum(v) for v in rows.values())
    shares = step_shares(named, replays)
    print(
        "| kernel | launches per step | us per step | mean us | share | us of the step's span |"
        "\n|---|---|---|---|---|---|"
    )
    for name, v in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        print(
            f"| {name} | {len(v) / replays:.0f} | {sum(v) / replays:.1f} | {np.mean(v):.2f} "
            f"| {sum(v) / total:.1%} | {shares[name]:.1f} |"
        )
    if sequence:
        write_sequence(named, replays, sequence)
    print(
        f"\nstep span {span / replays:.1f} us; some kernel running {busy / 1e3 / replays:.1f} us; "
        f"no kernel running {(span - busy / 1e3) / replays:.1f} us; kernel durations summed "
        f"{total / replays:.1f} us (more than the span where kernels overlap)"
    )


# ----- per-block clock records (--stamps) ---------------------------------------------------
RECORDS = 1 << 16  # SNUG_STAMP_RECORDS in stamps.cuh
FIELDS = ("entry", "release", "ready", "loaded", "stage", "first", "finish", "tail", "span")
WORDS = 10  # SNUG_STAMP_WORDS: weight pointer, shape, flags | SM | block, then 7 clock readings


def _stamp_views(projections) -> list[tuple]:
    """(record array, counter) device views of every compiled gemv4 module."""
    import cupy

    out = []
    for mod in projections.gemv4_modules:
        recs = mod.get_global("snug_stamps")
        n = mod.get_global("snug_nstamps")
        out.append(
            (
                cupy.ndarray((RECORDS, WORDS), cupy.uint64, memptr=recs),
                cupy.ndarray((1,), cupy.uint32, memptr=n),
            )
        )
    return out


def stamp_label(out: int, cols: int, flags: int) -> str:
    pro = flags & 15
    return f"{out}x{cols}" + (" swiglu" if flags & 16 else "") + (f" pro{pro}" if pro else "")


def stamp_variant(flags: int) -> str:
    """The gemv4 variant a record's flags name (gemv4.cu's stamps.write): warps a tile, tiles
    a block, groups a load, 'p' if pipelined, and threads a block."""
    tpb, ug, warps = (flags >> 6) & 63, (flags >> 12) & 15, (flags >> 16) & 255
    ks = warps // tpb if tpb else 0
    return f"{ks}/{tpb}/{ug}{'p' if flags & 32 else ''}, {32 * warps} thr"


def stamp_kernels(records: np.ndarray) -> list[dict]:
    """One entry per projection launch of a replay, in the order they ran."""
    by_w = defaultdict(list)
    for r in records:
        by_w[int(r[0])].append(r)
    ks = []
    for rows in by_w.values():
        a = np.array(rows, np.int64)
        t = a[:, 3:WORDS]
        shape, flags = int(a[0, 1]), int(a[0, 2] >> 40)
        ks.append(
            {
                "label": stamp_label(shape >> 32, shape & 0xFFFFFFFF, flags),
                "variant": stamp_variant(flags),
                "blocks": len(a),
                "S": t[:, 0].min(),
                "W": np.median(t[:, 1]),
                "X": np.median(t[:, 2]),
                "C": np.median(t[:, 3]),
                "R": np.median(t[:, 5]),
                "L": np.median(t[:, 6]),
                "Emed": np.median(t[:, 4]),
                "E": t[:, 4].max(),
            }
        )
    ks.sort(key=lambda k: k["W"])
    return ks


def stamp_phases(ks: list[dict]) -> dict[str, dict[str, list]]:
    """Per label, each field's values (ns) over the launches that have a predecessor."""
    agg: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for prev, k in zip(ks[:-1], ks[1:], strict=True):
        a = agg[k["label"]]
        a["entry"].append(k["S"] - prev["E"])
        a["release"].append(k["W"] - prev["E"])
        a["ready"].append(k["R"] - k["W"])
        a["loaded"].append(k["L"] - k["R"])
        a["stage"].append(k["X"] - k["W"])
        a["first"].append(k["C"] - k["X"])
        a["finish"].append(k["E"] - k["C"])
        a["tail"].append(k["E"] - k["Emed"])
        a["span"].append(k["E"] - prev["E"])
        a["blocks"].append(k["blocks"])
        a["variant"].append(k["variant"])
    return agg


def stamps(args) -> None:
    """The --stamps mode: replay the captured step, print the table, write stamps.json."""
    from engine.backends.cuda.projections import Projections

    Projections.gemv4_defines = ("SNUG_STAMPS",)
    replays = max(1, args.graph or 10)
    be, model, ids = prepared_step(args.shape, args.format, args.prompt, args.workdir, replays)
    graphs = captured_step(be, model, ids, args.tuned)
    views = _stamp_views(be.projections)
    agg: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    steps = []
    for _ in range(replays):
        for _, n in views:
            n.fill(0)
        be.stream.synchronize()
        graphs.replay_next(1)
        be.stream.synchronize()
        recs = np.concatenate([r[: min(int(n.get()[0]), len(r))].get() for r, n in views])
        ks = stamp_kernels(recs)
        steps.append((ks[-1]["E"] - ks[0]["S"]) / 1e3)
        for name, fields in stamp_phases(ks).items():
            for f, v in fields.items():
                agg[name][f].extend(v)
    print(
        f"{args.shape} {args.format}: {len(ks)} projections per step; first entry to last "
        f"exit {np.median(steps):.1f} us (median of {len(steps)} replays)"
    )
    head = "| projection | variant | launches/step | blocks | " + " | ".join(FIELDS) + " |"
    print("\nmean us per launch\n\n" + head + "\n|" + "---|" * (len(FIELDS) + 4))
    table = {}
    for name, fields in sorted(agg.items(), key=lambda kv: -sum(kv[1]["span"])):
        row = {f: float(np.mean(fields[f])) / 1e3 for f in FIELDS}
        row["launches_per_step"] = len(fields["span"]) / replays
        row["blocks"] = float(np.mean(fields["blocks"]))
        row["variant"] = " or ".join(sorted(set(fields["variant"])))
        table[name] = row
        cells = " | ".join(f"{row[f]:.2f}" for f in FIELDS)
        print(
            f"| {name} | {row['variant']} | {row['launches_per_step']:.0f} | {row['blocks']:.0f} "
            f"| {cells} |"
        )
    report = {"shape": args.shape, "format": args.format, "step_us": steps, "phases": table}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "stamps.json").write_text(json.dumps(report, indent=1))


def main() -> None:
    ap = step_args(__doc__)
    ap.add_argument("--summary", metavar="CSV")
    ap.add_argument("--graph", type=int, default=0, help="profile N replays of the decode graph")
    ap.add_argument("--cupti", metavar="CSV", help="with --graph: trace through torch's profiler")
    ap.add_argument("--timeline", metavar="CSV", help="an nsys cuda_gpu_trace CSV of --graph N")
    ap.add_argument(
        "--sequence", metavar="CSV", help="with --timeline: write one step's kernels in order"
    )
    ap.add_argument(
        "--stamps", action="store_true", help="per-block clock records of the projections"
    )
    ap.add_argument("--out", default=".", help="with --stamps: where stamps.json goes")
    args = ap.parse_args()
    if args.stamps:
        stamps(args)
    elif args.summary:
        summary(args.summary)
    elif args.timeline:
        timeline(args.timeline, max(1, args.graph), args.sequence)
    else:
        run_step(
            args.shape, args.format, args.prompt, args.workdir, args.graph, args.cupti, args.tuned
        )


if __name__ == "__main__":
    main()
