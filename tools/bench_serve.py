"""The OpenAI-compatible server under concurrent clients: what several streams give.

Loads a checkpoint through `Engine.load` (a folder, or a random one at a real shape with
--synth), serves it with `engine.server` (the scheduler behind `snug serve`) on 127.0.0.1,
and drives 1, 2, 4 and 8 concurrent clients with the official `openai` client: each client
streams --requests text completions of --max-tokens tokens (`ignore_eos`, so every reply
has that length) from a fresh random prompt of --prompt-tokens ids (no prompt-cache hits).
For each level: aggregate completion tokens/s over the wall time, time to first token and
time between tokens (between the streamed chunks) per stream, p50 and p99. Prints a table,
writes JSON with the GPU, commit and date.

    python3 tools/bench_serve.py --synth 4B:mlx4 --workdir /tmp/ckpt --out OUT
    python3 tools/bench_serve.py --model DIR --limit-gib 4 --out OUT
    python3 tools/bench_serve.py --model TINY --backend numpy --clients 1,2 --max-tokens 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
from pathlib import Path

import numpy as np

from engine.config import EngineSettings
from engine.device import probe_gpu
from engine.scheduler import Scheduler
from engine.server.app import create_app
from engine.server.cli import with_batch_invariant
from engine.server.runner import ServerThread
from engine.session import Engine
from engine.testing.receipt import commit


def one_request(client, model: str, prompt: list[int], max_tokens: int) -> dict:
    """Stream one completion; the arrival time of every chunk that carries text."""
    t0 = time.perf_counter()
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    arrivals, tokens = [], 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter())
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    first = arrivals[0] if arrivals else end
    return {"ttft": first - t0, "gaps": np.diff(arrivals).tolist(), "tokens": tokens, "end": end}


def run_level(url: str, model: str, clients: int, args, rng) -> dict:
    """`clients` threads, each with its own client, each sending `args.requests` requests."""
    import openai

    prompts = [
        [
            rng.integers(0, args.vocab, size=args.prompt_tokens).tolist()
            for _ in range(args.requests)
        ]
        for _ in range(clients)
    ]
    results: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client_thread(i: int) -> None:
        client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=3600)
        for prompt in prompts[i]:
            try:
                r = one_request(client, model, prompt, args.max_tokens)
            except Exception as exc:  # reported in the table
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                results.append(r)
        client.close()

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in results)

    def pct(values: list[float], q: float) -> float | None:
        return round(float(np.percentile(values, q)) * 1e3, 2) if values else None

    return {
        "clients": clients,
        "requests": len(results),
        "errors": errors,
        "completion_tokens": tokens,
        "wall_s": round(wall, 3),
        "aggregate_tok_s": round(tokens / wall, 2),
        "per_stream_tok_s": round(tokens / wall / clients, 2),
        "ttft_ms_p50": pct(ttft, 50),
        "ttft_ms_p99": pct(ttft, 99),
        "tbt_ms_p50": pct(gaps, 50),
        "tbt_ms_p99": pct(gaps, 99),
    }


def table(rows: list[dict], meta: dict) -> str:
    lines = [
        f"GPU: {meta['gpu']}; backend {meta['backend']}; commit {meta['commit']}; "
        f"{meta['date']}; model {meta['model']}; context {meta['context']}, "
        f"{meta['streams']} streams, prompts of {meta['prompt_tokens']} tokens, replies of "
        f"{meta['max_tokens']}; batch-invariant {'on' if meta.get('batch_invariant') else 'off'}",
        "",
        "| clients | requests | tokens/s (all) | tokens/s per stream | TTFT p50 ms | "
        "TTFT p99 ms | between tokens p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        failed = f" ({len(r['errors'])} failed)" if r["errors"] else ""
        lines.append(
            f"| {r['clients']} | {r['requests']}{failed} | {r['aggregate_tok_s']} | "
            f"{r['per_stream_tok_s']} | {r['ttft_ms_p50']} | {r['ttft_ms_p99']} | "
            f"{r['tbt_ms_p50']} | {r['tbt_ms_p99']} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint folder")
    src.add_argument("--synth", help="a random checkpoint at a real shape, e.g. 4B:mlx4")
    p.add_argument("--workdir", default="/tmp/snug-bench", help="where --synth writes it")
    p.add_argument("--clients", default="1,2,4,8", help="concurrency levels")
    p.add_argument("--requests", type=int, default=4, help="requests per client per level")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--streams", type=int, default=None, help="default: the most clients")
    p.add_argument("--max-rows", type=int, default=None, help="default: the plan's")
    p.add_argument("--prefill-chunk", type=int, default=None)
    p.add_argument("--backend", choices=["auto", "cuda", "numpy"], default=None)
    p.add_argument("--limit-gib", type=float, default=None, help="cap on what Snug holds")
    p.add_argument("--reserve-gib", type=float, default=None)
    p.add_argument(
        "--batch-invariant",
        choices=["on", "off"],
        default=None,
        help="as snug serve takes it (default: on with more than one stream)",
    )
    p.add_argument("--out", default=".", help="folder for bench_serve.json")
    p.add_argument("--commit", default=None, help="the tree's commit (default: git's HEAD)")
    args = p.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    settings = EngineSettings.from_env().with_gib(reserve=args.reserve_gib, limit=args.limit_gib)
    if args.backend:
        settings = dataclasses.replace(settings, backend=args.backend)
    args.streams = args.streams or max(levels)
    settings = with_batch_invariant(settings, args)  # what snug serve decodes with
    if args.synth:
        from engine.testing.synth import model_dir

        shape, fmt = args.synth.split(":")
        path = model_dir(args.workdir, shape, fmt)
    else:
        path = Path(args.model)
    streams = args.streams
    t = time.perf_counter()
    engine = Engine.load(
        path, settings, context=args.context, streams=streams, max_rows=args.max_rows
    )
    load_s = time.perf_counter() - t
    args.vocab = min(engine.vocab_rows, 400)  # ids every tokenizer here decodes
    scheduler = Scheduler(engine, queue_size=max(levels), prefill_chunk=args.prefill_chunk)
    server = ServerThread(create_app(scheduler.start())).start()
    gpu = probe_gpu()
    meta = {
        "gpu": gpu.name if gpu is not None else "none (CPU)",
        "backend": engine.backend_name,
        "commit": commit(args.commit),
        "date": time.strftime("%Y-%m-%d"),
        "model": str(path),
        "context": engine.context,
        "streams": engine.streams,
        "max_rows": engine.max_rows,
        "batch_invariant": settings.batch_invariant,
        "prefill_chunk": scheduler.prefill_chunk,
        "limit_gib": args.limit_gib,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "load_s": round(load_s, 2),
    }
    rng = np.random.default_rng(0)
    model = path.name
    rows = []
    try:
        for clients in levels:
            rows.append(run_level(server.url, model, clients, args, rng))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        server.stop()
        scheduler.close()
    s = scheduler.stats
    meta["scheduler"] = dataclasses.asdict(s)
    print()
    print(table(rows, meta))
    print(
        f"\nlongest stall of a decoding stream {s.longest_gap_s * 1e3:.1f} ms (longest "
        f"prefill chunk {s.longest_chunk_s * 1e3:.1f} ms, longest step "
        f"{s.longest_step_s * 1e3:.1f} ms); peak {s.peak_running} streams running"
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_serve.json").write_text(json.dumps({**meta, "levels": rows}, indent=1))
    engine.unload()


if __name__ == "__main__":
    main()
