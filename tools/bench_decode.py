"""Decode and prefill benchmark of the CUDA backend on random Qwen3.5 checkpoints (GPU only).

The table: writes random checkpoints at the real 0.8B / 4B / 9B shapes (MLX affine 4-bit g64
and bf16, engine/testing/synth.py), loads them through the normal loader into a CUDA
backend, and measures in one run: device copy bandwidth, load time, cold time to first
token, prefill tokens/s, batch-1 decode tokens/s after a 512-token prompt (chained replays
of the captured decode graph, then with the projections re-chosen by the step's own time as
the app's load does, and the app's reply loop), peak device memory and percent of the
bandwidth roofline measured in the same run; then transformers (torch bf16) on the same
bf16 weights and prompts. Prints a markdown table, writes bench.json and bench.md.

    python3 tools/bench_decode.py --runs 4B:mlx4 --prefill 512,2048,8192 --hf= --out OUT

Two options serve requests through the app's own path instead (`Engine.load`, then
`Engine.generate`), on the first model of --runs; they print a table, write serve.json:

    --first-request   no limit, eager warm-up, four 16K-token prompts, 256 tokens each: is
                      the first request's decode as fast as the later ones'?
    --small-card      a 4 GiB card simulated with the memory limit (--limit-gib, reserve
                      --reserve-gib), the context chosen by the planner, prompts of 48, 1,500
                      and 300 tokens: the pool's peak against the plan's bytes
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from engine.backends.base import Batch
from engine.checkpoint.checkpoint import Checkpoint
from engine.config import EngineSettings
from engine.memory.workspace import FAST_QUERY_ROWS
from engine.models.qwen35 import Qwen35Model
from engine.sampling import Draw
from engine.testing.synth import write_checkpoint
from tools.roofline import copy_bandwidth, decode_bytes, roofline_pct

PROMPT = 512
HF_MAX_PREFILL = 8192  # transformers runs its reference DeltaNet path; longer prompts take minutes
CHUNK = 2048


class Peak:
    def __init__(self) -> None:
        self.value = 0

    def sample(self) -> None:
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        self.value = max(self.value, total - free)


def sampled_rate(model, be, graphs, n: int, penalty: float = 0.0) -> float:
    """Decode as a chat reply samples it (temperature 0.7, top-k 20, top-p 0.8, the presence
    penalty given, drawn on the device): each step replays the graph, draws, and reads the
    4-byte token back. A short untimed reply first compiles the draw."""
    for steps in (4, n):
        prefill(model, be, PROMPT)
        token, pos = 1, PROMPT
        t = time.perf_counter()
        for i in range(steps):
            logits, greedy = graphs.replay(Batch.step([(0, pos)]), np.array([token]))
            first = (token,) if i == 0 else ()
            draw = Draw(0.7, 20, 0.8, i, penalty, 0, first, i == 0)
            token = int(be.sample_rows(logits, greedy, [draw]).get()[0])
            pos += 1
    return n / (time.perf_counter() - t)


def pipelined_rate(model, be, n: int, sampled: bool) -> float:
    """Decode as the app's reply loop runs it on the GPU (`CudaBackend.launch_step`): each
    step goes in before the host reads the token before it; sampled with the app's defaults
    (temperature 0.7, top-k 20, top-p 0.8, presence penalty 1.5) or greedy. A short untimed
    reply first compiles the draw."""

    def rows(i: int) -> list:
        return [Draw(0.7, 20, 0.8, i, 1.5, 0, (1,) if i == 0 else (), i == 0) if sampled else None]

    for steps in (4, n):
        prefill(model, be, PROMPT)
        t = time.perf_counter()
        pending = be.launch_step(Batch.step([(0, PROMPT)]), np.array([1]), rows(0))
        for i in range(1, steps):
            ahead = be.launch_step(None, None, rows(i))
            pending.tokens()
            pending = ahead
        pending.tokens()
    return n / (time.perf_counter() - t)


def decode_rate(model, be, graphs, n: int) -> float:
    """Recapture the decode graph (projections re-tuned if their choices were cleared) and
    time n - 1 chained replays after a fresh prompt."""
    graphs.teardown()
    graphs.warmed.discard(1)  # an eager step first: it tunes what the capture will use
    graphs.capture(1)
    prefill(model, be, PROMPT)
    graphs.replay(Batch.step([(0, PROMPT)]), np.array([1]))
    sync()
    t = time.perf_counter()
    for _ in range(n - 1):
        graphs.replay_next(1)
    sync()
    return (n - 1) / (time.perf_counter() - t)


def gemv_time(be, weights: dict) -> tuple[float, int]:
    """Seconds and bytes of one decode step's projections alone (graph of GEMVs only)."""
    import cupy

    from engine.backends.cuda.launch import on_stream
    from engine.backends.cuda.weights import DWeight, QWeight

    mats = [
        w
        for n, w in weights.items()
        if isinstance(w, QWeight | DWeight)
        and (n != "embed_tokens" or be.config.tie_word_embeddings)
    ]
    xs = {w.shape[1]: cupy.zeros((1, w.shape[1]), be.kernels.act_dtype) for w in mats}
    outs = [cupy.empty((1, w.shape[0]), be.kernels.act_dtype) for w in mats]
    for w, o in zip(mats, outs, strict=True):
        be.projections.gemv(xs[w.shape[1]], w, o)
    be.stream.synchronize()
    be.kernels.graphing = True  # launched as in a decode graph (overlapped where the GPU can)
    try:
        with on_stream(be.stream):
            be.stream.begin_capture()
            for w, o in zip(mats, outs, strict=True):
                be.projections.gemv(xs[w.shape[1]], w, o)
            graph = be.stream.end_capture()
    finally:
        be.kernels.graphing = False
    graph.launch(be.stream)
    be.stream.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        graph.launch(be.stream)
    be.stream.synchronize()
    return (time.perf_counter() - t) / 20, sum(w.nbytes for w in mats)


def sync() -> None:
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def prefill(model, be, n: int, slot: int = 0) -> float:
    """Seconds to prefill n random tokens into a fresh slot (first token on the host)."""
    rng = np.random.default_rng(n)
    ids = rng.integers(0, 200000, n)
    be.reset_slot(slot)
    sync()
    t0 = time.perf_counter()
    for start in range(0, n, CHUNK):
        rows = ids[start : start + CHUNK]
        logits = model.forward(Batch.window(slot, start, len(rows)), rows)
    be.to_host(be.sample_greedy(logits))
    return time.perf_counter() - t0


def bench_snug(path: Path, shape: str, fmt: str, args, bw: float) -> dict:
    from engine.backends.cuda.backend import CudaBackend
    from engine.backends.cuda.graphs import DecodeGraphs

    peak = Peak()
    peak.sample()
    base = peak.value
    t0 = time.perf_counter()
    ck = Checkpoint.open(path)
    be = CudaBackend(EngineSettings.from_env(), dtype="bfloat16", max_rows=CHUNK)
    be.score_rows = FAST_QUERY_ROWS  # what admission gives prefill attention on a large card
    weights = be.load_weights(ck, ck.config)
    sync()
    t_load = time.perf_counter() - t0
    # The context the state is sized for: what the prompts need, or more (--context: the app
    # on a large card sizes it to the model's limit, which sets the decode attention's grid).
    context = max(args.prefill + [PROMPT + args.decode_tokens + 8, args.context]) + 8
    be.alloc_state(ck.config, 1, context)
    model = Qwen35Model(ck.config, be, weights)
    t_first = prefill(model, be, PROMPT)
    ttft_cold = time.perf_counter() - t0
    peak.sample()
    res = {
        "shape": shape,
        "format": fmt,
        "load_s": t_load,
        "context": context,
        "ttft_cold_s": ttft_cold,
        "first_prefill_512_s": t_first,
        "weights_gb": be.arena.nbytes / 1e9,
    }
    # Decode: graph capture (its warm-up step zeroes slot 0), prompt, chained replays (no
    # host round trip).
    graphs = DecodeGraphs(be, model)
    t = time.perf_counter()
    graphs.capture(1)
    res["capture_s"] = time.perf_counter() - t
    prefill(model, be, PROMPT)
    graphs.replay(Batch.step([(0, PROMPT)]), np.array([1]))
    sync()
    n = args.decode_tokens
    t = time.perf_counter()
    for _ in range(n - 1):
        graphs.replay_next(1)
    sync()
    dt = (time.perf_counter() - t) / (n - 1)
    res["decode_tok_s"] = 1.0 / dt
    res["overlap_launches"] = be.kernels.pdl
    res["decode_tok_s_sampled"] = sampled_rate(model, be, graphs, n)
    # The app's defaults add a presence penalty of 1.5 (a bitmap of the reply on the device).
    res["decode_tok_s_sampled_penalty"] = sampled_rate(model, be, graphs, n, 1.5)
    # The app's reply loop: each step launched before the host reads the previous token.
    res["decode_tok_s_app_greedy"] = pipelined_rate(model, be, n, sampled=False)
    res["decode_tok_s_app_defaults"] = pipelined_rate(model, be, n, sampled=True)

    if be.kernels.pdl:  # the same step with plain launches, for what the overlap gains
        be.kernels.pdl = False
        res["decode_tok_s_plain_launches"] = decode_rate(model, be, graphs, n)
        be.kernels.pdl = True
    # The same step with its projections re-chosen by the step's own time (what an eager
    # load's warm-up does), then the per-shape choices back.
    chosen = dict(be.projections.tuner.choice)
    t = time.perf_counter()
    graphs.tune(1)
    res["step_tune_s"] = time.perf_counter() - t
    res["decode_tok_s_step_tuned"] = decode_rate(model, be, graphs, n)
    res["step_tuned_choice"] = {str(k): list(v) for k, v in be.projections.tuner.choice.items()}
    # The app's reply loop with those choices: what a chat on a large card runs.
    res["decode_tok_s_app_greedy_tuned"] = pipelined_rate(model, be, n, sampled=False)
    res["decode_tok_s_app_defaults_tuned"] = pipelined_rate(model, be, n, sampled=True)
    if args.search:  # every candidate of every shape in the step, two rounds
        t = time.perf_counter()
        graphs.tune(1, keep=None, passes=2, gain=0.002)
        res["step_search_s"] = time.perf_counter() - t
        res["decode_tok_s_step_searched"] = decode_rate(model, be, graphs, n)
        choice = be.projections.tuner.choice
        res["step_searched_choice"] = {str(k): list(v) for k, v in choice.items()}
    be.projections.tuner.choice.clear()
    be.projections.tuner.choice.update(chosen)
    graphs.teardown()
    graphs.capture(1)
    nbytes = decode_bytes(weights, ck.config, PROMPT + n // 2)
    res["bytes_per_token_gb"] = nbytes / 1e9
    res["roofline_pct"] = roofline_pct(1.0 / dt, nbytes, bw)
    t_gemv, gemv_bytes = gemv_time(be, weights)
    res["gemv_ms"] = t_gemv * 1e3
    res["gemv_gb_s"] = gemv_bytes / t_gemv / 1e9
    res["step_ms"] = dt * 1e3
    res["gemv_choice"] = {str(k): v for k, v in be.projections.tuner.choice.items() if k[1] == 1}
    # Eager decode (no graph) for the launch-overhead comparison.
    be.reset_slot(0)
    prefill(model, be, 64)
    sync()
    t = time.perf_counter()
    tok = 1
    for i in range(16):
        lg = model.forward(Batch.step([(0, 64 + i)]), np.array([tok]))
        tok = int(be.to_host(be.sample_greedy(lg))[0])
    res["eager_decode_tok_s"] = 16 / (time.perf_counter() - t)
    graphs.teardown()
    for n in args.prefill:
        s = prefill(model, be, n)
        res[f"prefill_{n}_s"] = s
        res[f"prefill_{n}_tok_s"] = n / s
        peak.sample()
    res["peak_gb"] = (peak.value - base) / 1e9
    del model, weights, be, graphs
    import cupy

    cupy.get_default_memory_pool().free_all_blocks()
    return res


def bench_hf(path: Path, decode_tokens: int, prefill: list[int]) -> dict:
    """transformers bf16 on the same weights: greedy decode after a 512-token prompt, and the
    time to the first token (prefill + one token) at each prompt length up to 8K."""
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16).cuda().eval()
    torch.cuda.synchronize()
    res = {"load_s": time.perf_counter() - t0}
    box = [model]
    del model
    tokens = np.random.default_rng(PROMPT).integers(0, 200000, max([PROMPT, *prefill]))

    def gen(n: int, prompt: int = PROMPT) -> float:
        ids = torch.tensor(tokens[:prompt])[None].cuda()
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            box[0].generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    gen(1)
    t1 = gen(1)
    tn = gen(decode_tokens + 1)
    res["decode_tok_s"] = decode_tokens / (tn - t1)
    for n in sorted({PROMPT, *(n for n in prefill if n <= HF_MAX_PREFILL)}):
        s = t1 if n == PROMPT else gen(1, n)
        res[f"prefill_{n}_s"], res[f"prefill_{n}_tok_s"] = s, n / s
    box.clear()
    torch.cuda.empty_cache()
    return res


def _prefills(r: dict) -> str:
    return " / ".join(
        f"{r[f'prefill_{n}_tok_s']:.0f}" if f"prefill_{n}_tok_s" in r else "-"
        for n in (512, 2048, 8192, 32768)
    )


def _s8(r: dict) -> str:
    return f"{r['prefill_8192_s']:.3f}" if "prefill_8192_s" in r else "-"


# The line under the table for each model: (result key, how it reads), where the run has it.
NOTES = (
    ("decode_tok_s_sampled", "sampled on the device (t 0.7, top-k 20, top-p 0.8) {:.0f} tok/s"),
    ("decode_tok_s_sampled_penalty", "with presence penalty 1.5 {:.0f} tok/s"),
    ("decode_tok_s_app_greedy", "the app's reply loop greedy {:.0f} tok/s"),
    ("decode_tok_s_app_defaults", "with the app's defaults {:.0f} tok/s"),
    ("decode_tok_s_plain_launches", "plain launches (no overlap) {:.0f} tok/s"),
    ("decode_tok_s_step_tuned", "projections re-chosen by the step's own time {:.0f} tok/s"),
    ("step_tune_s", "tuned in {:.1f} s"),
    ("decode_tok_s_app_greedy_tuned", "then the app's reply loop greedy {:.0f} tok/s"),
    ("decode_tok_s_app_defaults_tuned", "with the app's defaults {:.0f} tok/s"),
    ("decode_tok_s_step_searched", "every candidate tried in the step {:.0f} tok/s"),
    ("vs_transformers_decode", "{:.1f}x transformers' decode"),
    ("vs_transformers_prefill_8k", "{:.1f}x its 8K prefill"),
)


def table(results: list[dict], bw: float, meta: dict) -> str:
    lines = [
        f"GPU: {meta['gpu']}; commit {meta['commit']}; {meta['date']}; copy bandwidth "
        f"{bw:.0f} GB/s (read + write).",
        "",
        "| model | format | load s | cold TTFT s | decode tok/s (graph) | eager tok/s | "
        "% roofline | step-tuned tok/s (the app), % roofline | "
        "prefill 512 / 2K / 8K / 32K tok/s | 8K s | peak GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.get("engine") == "transformers":
            lines.append(
                f"| {r['shape']} | transformers bf16 | {r['load_s']:.1f} | - | "
                f"{r['decode_tok_s']:.1f} | - | - | - | {_prefills(r)} | {_s8(r)} | - |"
            )
            continue
        pf, s8, tuned = _prefills(r), _s8(r), "-"
        if "decode_tok_s_step_tuned" in r:  # the roofline share scales with the rate
            t = r["decode_tok_s_step_tuned"]
            tuned = f"{t:.0f}, {r['roofline_pct'] * t / r['decode_tok_s']:.1f}%"
        lines.append(
            f"| {r['shape']} | {r['format']} | {r['load_s']:.1f} | {r['ttft_cold_s']:.2f} | "
            f"{r['decode_tok_s']:.0f} | {r['eager_decode_tok_s']:.0f} | "
            f"{r['roofline_pct']:.1f}% | {tuned} | {pf} | {s8} | {r['peak_gb']:.2f} |"
        )
    lines.append("")
    for r in results:
        if "gemv_ms" in r:
            notes = [text.format(r[key]) for key, text in NOTES if key in r]
            lines.append(
                f"- {r['shape']} {r['format']}: decode step {r['step_ms']:.3f} ms, of which the "
                f"projections alone (GEMV-only graph) {r['gemv_ms']:.3f} ms at "
                f"{r['gemv_gb_s']:.0f} GB/s; graph capture {r['capture_s'] * 1e3:.0f} ms; "
                + "; ".join(notes)
            )
    return "\n".join(lines)


def serve(args, meta: dict) -> None:
    """--first-request / --small-card (see the module docstring): requests through
    `Engine.load` and `Engine.generate` on the first model of --runs, in this process (the
    cell of tools/bench_small_card.py, the prompt cache kept between requests); writes
    serve.json."""
    from engine.config import GIB
    from engine.testing.synth import model_dir

    try:
        from tools.bench_small_card import serve_cell
    except ImportError:  # run as a script without the repository root on the path
        from bench_small_card import serve_cell

    shape, fmt = args.runs.split(",")[0].split(":")
    small = args.small_card
    default = "48,1500,300" if small else "16384,16384,16384,16384"
    prompts = [int(x) for x in (args.prompts or default).split(",")]
    new = 64 if small else 256
    settings = EngineSettings(backend="cuda")
    if small:
        settings = settings.with_gib(reserve=args.reserve_gib, limit=args.limit_gib)
    context = None if small else max(prompts) + new + 64  # None: the largest the plan admits
    path = model_dir(args.workdir, shape, fmt)
    cell = serve_cell(path, settings, context, prompts[0], prompts[1:], new, clear=False)
    rows = [cell["first"], *cell["rows"]]
    later = [r["decode_tok_s"] for r in rows[1:] if "decode_tok_s" in r]
    d = cell["decision"]
    peak = max(r.get("pool_peak_bytes", 0) for r in rows)
    planned = max(r.get("plan_peak_bytes", 0) for r in rows)
    res = meta | {
        "shape": shape,
        "format": fmt,
        "limit_gib": args.limit_gib if small else None,
        "reserve_gib": settings.reserve_bytes / GIB,
        "verdict": d["verdict"],
        "context": d["context"],
        "max_rows": d["max_rows"],
        "eager": d["eager"],
        "load_s": round(cell["load_s"], 2),
        "requests": rows,
        "first_over_later": rows[0]["decode_tok_s"] / np.mean(later) if later else None,
        "planned_gib": planned / GIB,
        "pool_peak_gib": peak / GIB,
        "nvml_peak_gib": (cell["nvml_peak_bytes"] or 0) / GIB,
        "nvml_before_gib": (cell["nvml_baseline_bytes"] or 0) / GIB,
        "held_by_category": rows[-1].get("held_by_category"),
    }
    print("\n| request | prompt | TTFT s | prefill tok/s | decode tok/s | scratch rows |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        if "ttft_s" not in r:
            print(f"| {i + 1} | {r['prompt']} | {r['skipped']} | - | - | - |")
            continue
        print(
            f"| {i + 1} | {r['prompt']} | {r['ttft_s']:.3f} | {r['prefill_tok_s']:.0f} | "
            f"{r['decode_tok_s']:.1f} | {r.get('scratch_rows', '-')} |"
        )
    if later:
        print(f"\nfirst request's decode / later requests' mean: {res['first_over_later']:.3f}")
    print(
        f"{d['verdict']}: context {d['context']:,}, max rows {d['max_rows']}, "
        f"{'eager' if d['eager'] else 'lazy'} scratch; plan {res['planned_gib']:.3f} GiB (saved "
        f"states at what they hold), pool peak {res['pool_peak_gib']:.3f} GiB (each request's "
        f"own); the whole GPU's peak {res['nvml_peak_gib']:.3f} GiB (NVML, "
        f"{res['nvml_before_gib']:.3f} before the load)"
    )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "serve.json").write_text(json.dumps(res, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs",
        default="4B:mlx4,4B:bf16,0.8B:mlx4,9B:mlx4",
        help="shape:format pairs, in order (4B MLX 4-bit is the headline)",
    )
    ap.add_argument("--prefill", default="512,2048,8192,32768")
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--hf", default="4B", help="shapes to run transformers on ('' for none)")
    ap.add_argument("--context", type=int, default=0, help="state sized for at least this")
    ap.add_argument("--workdir", default="/tmp/snug-bench")
    ap.add_argument("--out", default=".")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument(
        "--search", action="store_true", help="a row with every projection candidate tried"
    )
    ap.add_argument("--first-request", action="store_true", help="the first request's speed")
    ap.add_argument("--small-card", action="store_true", help="a card simulated by the limit")
    ap.add_argument("--limit-gib", type=float, default=4.0, help="with --small-card")
    ap.add_argument("--reserve-gib", type=float, default=0.5, help="with --small-card")
    ap.add_argument("--prompts", default="", help="prompt lengths of the served requests")
    args = ap.parse_args()
    args.prefill = [int(x) for x in args.prefill.split(",") if x]
    import cupy

    from engine.testing.receipt import commit

    props = cupy.cuda.runtime.getDeviceProperties(0)
    date = time.strftime("%Y-%m-%d")
    meta = {"gpu": props["name"].decode(), "date": date, "commit": commit(args.commit)}
    if args.first_request or args.small_card:
        serve(args, meta)
        return
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    results = []
    work = Path(args.workdir)
    for run in args.runs.split(","):
        shape, fmt = run.split(":")
        t = time.perf_counter()
        path = write_checkpoint(work / f"{shape}-{fmt}", shape, fmt, seed=1)
        print(f"wrote {shape} {fmt} in {time.perf_counter() - t:.1f} s", flush=True)
        r = bench_snug(path, shape, fmt, args, bw)
        print(json.dumps(r), flush=True)
        results.append(r)
        if fmt == "bf16" and shape in args.hf.split(","):
            try:
                h = bench_hf(path, 32, args.prefill)
                h.update(engine="transformers", shape=shape, format="bf16")
                results.append(h)
                print(json.dumps(h), flush=True)
                r["vs_transformers_decode"] = r["decode_tok_s"] / h["decode_tok_s"]
                if "prefill_8192_s" in h and "prefill_8192_s" in r:
                    r["vs_transformers_prefill_8k"] = h["prefill_8192_s"] / r["prefill_8192_s"]
            except Exception as exc:  # report and go on: the peer is optional
                print(f"transformers run failed: {type(exc).__name__}: {exc}", flush=True)
        shutil.rmtree(path, ignore_errors=True)
        write_report(results, bw, meta, Path(args.out))
    print(table(results, bw, meta))


def write_report(results: list[dict], bw: float, meta: dict, out: Path) -> None:
    """Rewritten after every model, so a run cut short still leaves its numbers."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(
        json.dumps({"meta": meta, "bandwidth_gb_s": bw, "results": results}, indent=1)
    )
    (out / "bench.md").write_text(table(results, bw, meta) + "\n")


if __name__ == "__main__":
    main()
