"""Small cards through the app's path: memory limits x model sizes x prompt lengths.

Each (size, limit) cell runs in a process of its own (this script with --cell), so its first
request is the first request of a new process and its memory starts clean. In it:
`Engine.load` of a random checkpoint at the real shape (engine/testing/synth.py, MLX 4-bit)
with the limit standing in for the card (reserve --reserve-gib; the context: --context, else
with no limit the longest prompt plus the reply plus 64 tokens, with a limit the longest the
plan admits),
then `Engine.generate` as the app calls it, greedy (`--sampled`: the app's sampling defaults),
--new-tokens tokens a reply (end of
sequence ignored, so every reply has its length): a first request, then for each prompt
length the context admits a warm request of fresh random ids (no prompt-cache hit). Each warm
request starts with the prompt cache emptied and the pool's peak reset, so its row's peak is
its own. A row gives the time to first token, decode tokens/s with its share of the
bandwidth roofline (tools/roofline.py, the copy bandwidth measured in the cell after its
requests), the plan's predicted speed,
the plan's peak (saved prompt states counted at what the cache holds on the card:
`Decision.planned_peak`) against the pool's peak, and the whole GPU's peak used memory from
NVML (sampled every 10 ms). A cell the plan refuses prints the plan's verdict. Then the
targets' verdicts. Writes small_card.json and small_card.md to --out after every cell; a CUDA
cell's JSON also holds the projection variant the tuning chose for each shape, which
--choices prints a line a cell.

    python3 tools/bench_small_card.py --out OUT                 # the whole matrix
    python3 tools/bench_small_card.py --sizes 4B --time-budget 540 --out OUT
    python3 tools/bench_small_card.py --merge A/small_card.json B/small_card.json --out OUT
    python3 tools/bench_small_card.py --choices OUT/small_card.json
    python3 tools/bench_small_card.py --backend numpy --sizes tiny --limits none \\
        --prompts 16,32 --new-tokens 4 --out OUT                # a CPU smoke run
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
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from tools.roofline import copy_bandwidth, decode_bytes, roofline_pct
from tools.small_card_report import GIB, choices_text, merge, report_text, write_report

REPO = Path(__file__).resolve().parents[1]
SIZES = "0.8B,4B,9B"
LIMITS = "none,8,6,4,3.5,3"
PROMPTS = "512,8192,16384,32768"
MARGIN = 64  # tokens of context past the longest prompt and its reply, without a limit
PROMPT_IDS = 400  # random prompts draw ids below this: text in every tokenizer here
MIN_CELL_S = 30.0  # a cell is not started with less of the time budget left
# `--sampled`: the app's sampling defaults for replies without thinking (app/state/
# settings.py, which imports Qt): its temperature, top-k and top-p are SamplingParams' own;
# its presence penalty (drawn on the device with the penalty's bitmap) is this.
APP_PRESENCE_PENALTY = 1.5
GRACE_S = 20.0  # a cell's process may run this far past the budget before it is stopped


# ----- one cell, in its own process -------------------------------------------------------


class NvmlPeak:
    """The whole GPU's used memory (every process), sampled by a thread every `period`
    seconds: the peak since start, and since the last `window()`. None without NVML."""

    def __init__(self, period: float = 0.01, index: int = 0) -> None:
        self.baseline = self.peak = self.window_peak = None
        self._stop = threading.Event()
        self._thread = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.baseline = self.peak = self.window_peak = self._read()
        except Exception:  # no GPU, no driver: the rows say "-"
            self._handle = None
            return
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _read(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            used = self._read()
            self.peak = max(self.peak, used)
            self.window_peak = max(self.window_peak, used)

    def window(self) -> None:
        if self._handle is not None:
            self.window_peak = self._read()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._nvml.nvmlShutdown()
            self._thread = None


def _predictor(engine, decision) -> Callable[[int], tuple[float | None, float | None]]:
    """(predicted seconds to the first token of an n-token prompt, predicted decode tok/s)
    from the decision's cost model on this card (engine.memory.speed)."""
    from engine.device import probe_gpu
    from engine.memory.speed import predict

    gpu = probe_gpu()
    if decision is None or decision.prediction is None or gpu is None or gpu.speed is None:
        return lambda n: (None, None)
    b = decision.breakdown

    def at(n: int) -> tuple[float, float]:
        # The time to the first token only: the decode rate is the decision's own.
        tensor = engine.backend.fused_prefill_attention(engine.config)
        p = predict(
            engine.config, b.weights, 0, n, decision.max_rows, gpu.speed, tensor_prefill=tensor
        )
        return p.ttft_s, decision.prediction.decode_tok_s

    return at


def _request(
    engine, n: int, new: int, rng, nvml: NvmlPeak, predicted, clear: bool, sampled: bool
) -> dict:
    """One `Engine.generate` of n fresh random ids, greedy or (`sampled`) with the app's
    sampling defaults; its row."""
    from engine.session import GenerationParams

    pool, decision = engine.backend.pool, engine.decision
    if clear:  # this row's saved states only: its plan and pool peaks are its own
        engine.prompt_cache.clear()
    if pool is not None:
        pool.reset_peak()
    nvml.window()
    ids = rng.integers(0, min(PROMPT_IDS, engine.vocab_rows), size=n).tolist()
    if sampled:
        params = GenerationParams(max_new_tokens=new, seed=n, presence_penalty=APP_PRESENCE_PENALTY)
    else:
        params = GenerationParams(max_new_tokens=new, greedy=True)
    stats = list(engine.generate(ids, params))[-1].stats
    ttft_pred, decode_pred = predicted(n)
    row = {
        "prompt": n,
        "new_tokens": stats.new_tokens,
        "ttft_s": stats.ttft_s,
        "prefill_tok_s": stats.prefill_tok_s,
        "decode_tok_s": stats.decode_tok_s,
        "predicted_ttft_s": ttft_pred,
        "predicted_decode_tok_s": decode_pred,
        "nvml_peak_bytes": nvml.window_peak,
    }
    frame = getattr(engine.backend, "frame", None)
    if frame is not None:
        row["scratch_rows"] = frame.mem_scratch.capacity_rows
    if pool is not None and decision is not None:
        held = engine.prompt_cache.device.held_bytes
        row |= {
            "cache_held_bytes": held,
            "plan_peak_bytes": decision.planned_peak(held),
            "pool_peak_bytes": pool.peak_bytes,
            "held_by_category": pool.held_by_category(),
        }
    return row


def _estimate_s(row: dict | None, n: int, first: int, predicted) -> float:
    """Seconds a request of n tokens may take: the prediction, or the first request's
    prefill rate, with room for long-prompt attention and the reply."""
    ttft = predicted(n)[0]
    if ttft is None and row is not None:
        ttft = n / max(row["prefill_tok_s"], 1.0) * max(1.0, n / max(first, 1))
    return 3.0 * (ttft or 0.0) + 2.0


def serve_cell(
    path: Path,
    settings,
    context: int | None,
    first: int,
    prompts: list[int],
    new: int,
    deadline: float | None = None,
    clear: bool = True,
    started: float | None = None,
    log: Callable[[str], None] = print,
    max_rows: int | None = None,
    sampled: bool = False,
) -> dict:
    """Load `path` through `Engine.load` and serve a first request of `first` tokens, then
    one of each length in `prompts` that the context admits (in order), in this process.
    `deadline` (time.time()): lengths that would run past it are skipped. `clear`: each of
    those requests starts with the prompt cache empty. `started` (time.time()): when the
    process was started, for the first token's time from there."""
    from engine.errors import DoesNotFit
    from engine.session import Engine

    nvml = NvmlPeak(float(os.environ.get("SNUG_BENCH_NVML_PERIOD", "0.01")))
    out: dict = {"fits": True, "nvml_baseline_bytes": nvml.baseline, "rows": []}
    t = time.perf_counter()
    try:
        engine = Engine.load(path, settings, context=context, max_rows=max_rows)
    except DoesNotFit as exc:
        nvml.stop()
        d = exc.decision
        log(d.format_table())
        return out | {"fits": False, "decision": d.to_dict(), "reason": d.reason}
    d, pool = engine.decision, engine.backend.pool
    out |= {
        "load_s": time.perf_counter() - t,
        "context": engine.context,
        "max_rows": engine.max_rows,
        "backend": engine.backend_name,
        "decision": d.to_dict() if d is not None else None,
        "pool_peak_load_bytes": pool.peak_bytes if pool is not None else None,
    }
    if d is not None:
        log(d.format_table())
    engine.eos_ids = frozenset()  # random weights may pick an end token: every reply runs
    rng = np.random.default_rng(0)
    predicted = _predictor(engine, d)
    try:
        out["first"] = _request(engine, first, new, rng, nvml, predicted, False, sampled)
        if started is not None:
            out["start_to_first_token_s"] = time.time() - started
        log(json.dumps({"first": out["first"]}, default=str))
        for n in prompts:
            if n + new > engine.context:
                out["rows"].append({"prompt": n, "skipped": "not admitted"})
                continue
            need = _estimate_s(out["first"], n, first, predicted)
            if deadline is not None and time.time() + need > deadline:
                out["rows"].append({"prompt": n, "skipped": "time budget"})
                continue
            out["rows"].append(_request(engine, n, new, rng, nvml, predicted, clear, sampled))
            log(json.dumps(out["rows"][-1], default=str))
    finally:
        nvml.stop()
        out["nvml_peak_bytes"] = nvml.peak
        if engine.backend_name == "cuda":  # after the requests: no cost to the first one
            _roofline(engine, out, new)
            tuner = engine.backend.projections.tuner  # the variant each projection runs
            out["projection_choices"] = {str(k): list(v) for k, v in tuner.choice.items()}
        engine.unload()
    return out


def _roofline(engine, out: dict, new: int) -> None:
    """Each row's decode as a share of the bandwidth limit: the bytes a token reads at the
    reply's middle position over the copy bandwidth measured here (tools/roofline.py)."""
    out["copy_gb_s"] = bandwidth = copy_bandwidth(1 << 28)  # fits beside the model on a small card
    for row in [out.get("first"), *out["rows"]]:
        if row and "decode_tok_s" in row:
            nbytes = decode_bytes(engine.model.w, engine.model.config, row["prompt"] + new // 2)
            row["roofline_pct"] = roofline_pct(row["decode_tok_s"], nbytes, bandwidth)


def cell_main(args) -> None:
    """--cell: one (size, limit) cell; its result as JSON in --cell-out."""
    from engine.config import EngineSettings
    from engine.testing.synth import model_dir

    settings = EngineSettings(backend=args.backend)
    if args.kv_cache:
        settings = replace(settings, kv_cache=args.kv_cache)
    limit = parse_limit(args.limit)
    prompts = parse_ints(args.prompts)
    context = args.context or None
    if limit is not None:
        settings = settings.with_gib(reserve=args.reserve_gib, limit=limit)
    elif context is None:
        context = max(prompts + [args.first_prompt]) + args.new_tokens + MARGIN
    path = model_dir(args.workdir, args.size, args.format)
    first, new = args.first_prompt, args.new_tokens
    try:
        res = serve_cell(path, settings, context, first, prompts, new, args.deadline,
                         not args.keep_saved, args.started, max_rows=args.max_rows,
                         sampled=args.sampled)  # fmt: skip
    except Exception as exc:  # the table says what failed; the log has the traceback
        traceback.print_exc()
        res = {"error": f"failed: {type(exc).__name__}: {exc}"[:300].replace("|", "/")}
    res |= {"size": args.size, "format": args.format, "limit_gib": limit}
    res["reserve_gib"] = args.reserve_gib if limit is not None else settings.reserve_bytes / GIB
    Path(args.cell_out).write_text(json.dumps(res, indent=1, default=str))


# ----- the matrix, in the parent process (which never opens the GPU) ----------------------


def parse_limit(text: str | float | None) -> float | None:
    if text is None or str(text).strip().lower() in ("", "none", "0"):
        return None
    return float(text)


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def spawn_cell(args, size: str, limit: float | None, left: float | None) -> dict:
    """Run one cell in a new process of this script; its result, or why there is none."""
    from engine.testing.synth import model_dir

    t = time.perf_counter()
    model_dir(args.workdir, size, args.format)  # written once (it takes a while), reused
    print(f"{size} {args.format}: checkpoint ready in {time.perf_counter() - t:.1f} s", flush=True)
    cell = {"size": size, "format": args.format, "limit_gib": limit}
    if left is not None:
        left -= time.perf_counter() - t
        if left < MIN_CELL_S:
            return cell | {"error": "not run: the time budget was spent"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cell.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--cell", "--size", size]
        cmd += ["--limit", str(limit), "--cell-out", str(out)]
        flags = "prompts first_prompt new_tokens reserve_gib format max_rows context".split()
        for flag in flags:
            if getattr(args, flag) is not None:
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        cmd += ["--workdir", args.workdir, "--backend", args.backend]
        if args.kv_cache:
            cmd += ["--kv-cache", args.kv_cache]
        if args.keep_saved:
            cmd += ["--keep-saved"]
        if args.sampled:
            cmd += ["--sampled"]
        if left is not None:
            cmd += ["--deadline", str(time.time() + left)]
        paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(x for x in paths if x))
        t = time.perf_counter()
        cmd += ["--started", str(time.time())]
        try:
            got = subprocess.run(cmd, env=env, timeout=None if left is None else left + GRACE_S)
        except subprocess.TimeoutExpired:
            spent = time.perf_counter() - t
            return cell | {"error": f"stopped by the time budget after {spent:.0f} s"}
        if not out.exists():
            return cell | {"error": f"the cell's process exited with {got.returncode}"}
        result = json.loads(out.read_text())
    return result | {"wall_s": time.perf_counter() - t}


def run_matrix(args, runner=spawn_cell, clock=time.monotonic, report=None) -> list[dict]:
    """Every (size, limit) cell in order, each through `runner(args, size, limit, left)`;
    cells that the time budget (--time-budget seconds, 0: none) leaves no room for are
    recorded as skipped. `report(cells)` after each."""
    start, cells = clock(), []
    for size in args.sizes.split(","):
        for limit in [parse_limit(x) for x in args.limits.split(",")]:
            left = None
            if args.time_budget:
                left = args.time_budget - (clock() - start)
            if left is not None and left < MIN_CELL_S:
                why = "not run: the time budget was spent"
                cells.append(
                    {"size": size, "format": args.format, "limit_gib": limit, "error": why}
                )
            else:
                cells.append(runner(args, size, limit, left))
            if report is not None:
                report(cells)
    return cells


def _meta(args) -> dict:
    from engine.device import probe_gpu  # NVML only: the parent opens no CUDA context
    from engine.testing.receipt import commit

    gpu = probe_gpu()
    return {
        "gpu": gpu.name if gpu is not None else "none (CPU)",
        "driver": gpu.driver if gpu is not None else None,
        "commit": commit(args.commit),
        "date": time.strftime("%Y-%m-%d"),
        "backend": args.backend,
        "format": args.format,
        "new_tokens": args.new_tokens,
        "reserve_gib": args.reserve_gib,
        "prompts": parse_ints(args.prompts),
        "kv_cache": args.kv_cache or "default",
        "keep_saved": args.keep_saved,
        "sampled": args.sampled,
    }


def parse_args(argv: list[str] | None = None):
    from engine.config import KV_CACHES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=SIZES, help="model shapes (engine/testing/synth.py)")
    ap.add_argument("--limits", default=LIMITS, help="GiB the engine may hold; none: no limit")
    ap.add_argument("--prompts", default=PROMPTS, help="prompt lengths of the warm requests")
    ap.add_argument("--first-prompt", type=int, default=0, help="default: the shortest prompt")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--max-rows", type=int, default=None, help="default: the plan's")
    ap.add_argument("--context", type=int, default=None, help="default: see above")
    ap.add_argument("--reserve-gib", type=float, default=0.5, help="with a limit")
    ap.add_argument("--format", default="mlx4", choices=["mlx4", "mlx8", "bf16"])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "numpy", "auto"])
    ap.add_argument("--kv-cache", default=None, choices=list(KV_CACHES))
    ap.add_argument(
        "--keep-saved",
        action="store_true",
        help="each request keeps the states saved by those before it, as a chat's later turns "
        "do (default: each starts with the prompt cache empty)",
    )
    ap.add_argument(
        "--sampled",
        action="store_true",
        help="replies drawn with the app's sampling defaults (default: greedy)",
    )
    ap.add_argument("--workdir", default="/tmp/snug-bench", help="the random checkpoints")
    ap.add_argument("--out", default=".")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--time-budget", type=float, default=0.0, help="seconds for the matrix")
    ap.add_argument("--merge", nargs="+", help="one table from earlier runs' small_card.json")
    ap.add_argument("--choices", help="a small_card.json: the projection variants each cell ran")
    ap.add_argument("--cell", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size", help=argparse.SUPPRESS)
    ap.add_argument("--limit", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cell-out", help=argparse.SUPPRESS)
    ap.add_argument("--started", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.first_prompt = args.first_prompt or min(parse_ints(args.prompts))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cell:
        cell_main(args)
        return
    if args.choices:
        print(choices_text(json.loads(Path(args.choices).read_text())["cells"]))
        return
    if args.merge:
        cells, meta = merge(args.merge)
    else:
        meta = _meta(args)
        cells = run_matrix(args, report=lambda cs: write_report(cs, meta, Path(args.out)))
    write_report(cells, meta, Path(args.out))
    print(report_text(cells, meta))


if __name__ == "__main__":
    main()
