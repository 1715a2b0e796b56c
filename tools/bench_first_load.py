"""A model's first load on a machine whose kernel cache is empty, then a load that finds it.

    PYTHONPATH=. python3 tools/bench_first_load.py --sizes 4B,0.8B --limit 4 --out OUT

Each load runs in a new process through `Engine.load` (the app's defaults: an 8,192-token
context, one stream), the first with CUPY_CACHE_DIR pointing at an empty folder, the second
at the folder the first filled. The table gives each load's seconds, the seconds it spent
at each progress stage, and the programs CuPy compiled or read from its cache (with the
seconds those calls took, summed over threads), how many the compile threads asked for, and
how many only the loading thread did (CuPy's own copies and fills, and any of Snug's the
threads missed). JSON: OUT/first_load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cell(size: str, limit: float | None, workdir: str, out: str) -> None:
    """--cell: one load in this process; its figures as JSON in `out`."""
    from cupy.cuda import compiler

    from engine.config import EngineSettings
    from engine.session import Engine
    from engine.testing.synth import model_dir

    path = model_dir(workdir, size, "mlx4")
    calls: list[float] = []
    threads: set[tuple] = set()  # each program's key, asked for by the compile threads
    loading: set[tuple] = set()  # ... by the loading thread
    real = compiler._compile_module_with_cache

    def timed(source, options, *args, **kwargs):
        key = (source, tuple(options), tuple(sorted(kwargs.get("name_expressions") or ())))
        on_thread = threading.current_thread().name.startswith("snug-compile")
        (threads if on_thread else loading).add(key)
        t = time.perf_counter()
        try:
            return real(source, options, *args, **kwargs)
        finally:
            calls.append(time.perf_counter() - t)

    compiler._compile_module_with_cache = timed  # every program, compiled or read from disk
    settings = EngineSettings(backend="cuda")
    if limit is not None:
        settings = settings.with_gib(reserve=0.5, limit=limit)
    stages: list[tuple[str, float]] = []
    t = time.perf_counter()

    def progress(stage: str, _fraction: float) -> None:
        name = stage.split(",")[0]  # "compiling kernels, 3 of 58" counts as one stage
        if not stages or stages[-1][0] != name:
            stages.append((name, time.perf_counter() - t))

    engine = Engine.load(path, settings, context=8192, streams=1, progress=progress)
    load_s = time.perf_counter() - t
    engine.unload()
    spans = stage_spans(stages + [("loaded", load_s)])
    result = {"load_s": load_s, "stages_s": spans, "programs": len(calls), "program_s": sum(calls)}
    # Programs the load asked for that the threads did not (CuPy's own copies and fills
    # among them: the compile threads make Snug's kernels only).
    result |= {"on_threads": len(threads), "loading_only": len(loading - threads)}
    Path(out).write_text(json.dumps(result))


def stage_spans(stages: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds from each (stage, start) to the next one's start."""
    return {name: nxt - start for (name, start), (_, nxt) in zip(stages, stages[1:], strict=False)}


def spawn(args, size: str, cache: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cell.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", "--sizes", size]
        cmd += ["--limit", str(args.limit), "--workdir", args.workdir, "--cell-out", str(out)]
        paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
        python_path = os.pathsep.join(p for p in paths if p)
        env = dict(os.environ, CUPY_CACHE_DIR=cache, PYTHONPATH=python_path)
        got = subprocess.run(cmd, env=env)
        if not out.exists():
            return {"error": f"the load's process exited with {got.returncode}"}
        return json.loads(out.read_text())


def table(rows: list[dict]) -> str:
    lines = [
        "| size | kernel cache | load s | loading weights s | compiling kernels s | warming up s "
        "| programs (s in CuPy) | on the threads | loading thread only |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['size']} | {r['cache']} | {r['error']} | | | | | | |")
            continue
        st = r["stages_s"]
        lines.append(
            f"| {r['size']} | {r['cache']} | {r['load_s']:.1f} | "
            f"{st.get('loading weights', 0.0):.1f} | {st.get('compiling kernels', 0.0):.1f} | "
            f"{st.get('warming up', 0.0):.1f} | "
            f"{r['programs']} ({r['program_s']:.1f}) | {r.get('on_threads', '-')} | "
            f"{r.get('loading_only', '-')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4B", help="model shapes (engine/testing/synth.py)")
    ap.add_argument("--limit", default="4", help="the loads' memory limit, GiB (none: the card)")
    ap.add_argument("--workdir", default="/tmp/snug-bench", help="the random checkpoints")
    ap.add_argument("--out", default="first_load_out")
    ap.add_argument("--commit", default=None, help="the commit to record (else git's HEAD)")
    ap.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cell-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    limit = None if args.limit.lower() in ("none", "0") else float(args.limit)
    if args.cell:
        cell(args.sizes, limit, args.workdir, args.cell_out)
        return
    from engine.testing.synth import model_dir

    rows = []
    for size in args.sizes.split(","):
        model_dir(args.workdir, size, "mlx4")  # written once, outside the timed loads
        with tempfile.TemporaryDirectory(prefix="snug-kernels-") as cache:
            for label in ("empty", "filled by the load before"):
                rows.append(spawn(args, size, cache) | {"size": size, "cache": label})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from engine.device import probe_gpu
    from engine.testing.receipt import commit

    gpu = probe_gpu()
    meta = {
        "gpu": gpu.name if gpu is not None else "none",
        "commit": commit(args.commit),
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "limit_gib": limit,
    }
    (out / "first_load.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
