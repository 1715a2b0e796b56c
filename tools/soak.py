"""Soak: many requests of mixed lengths through `snug serve`, memory read as they go.

Loads a checkpoint through `Engine.load` under a memory limit (default: a random 4B in MLX
4-bit, written by engine/testing/synth.py, under 4 GiB, the context the largest the plan
admits), serves it with `engine.server` (the scheduler behind `snug serve`) on 127.0.0.1,
and sends --requests streamed completions of token ids from --clients concurrent HTTP
clients (httpx). The mix is seeded: prompts mostly of 16 to 512 tokens, some up to 2,048,
a few up to --max-prompt; replies of 1 to --max-tokens tokens (end of sequence ignored, so
a reply has exactly the tokens asked); 10% follow-ups of an earlier prompt (a prompt-cache
hit where the saved states are on the card); 5% cancelled by the client after a token or
two; 3% longer than the context, which the server refuses (400) before the engine sees them.

The requests go in rounds of --every. Between rounds, with nothing in flight, it reads the
pool's bytes by category, the card's used bytes (cudaMemGetInfo), CuPy's pooled bytes, the
process's resident memory and the prompt cache's, and sends one probe (greedy, the same
prompt every round, alone) whose reply must not change. At the end it empties the prompt
cache and reads once more. Errors are counted by kind; the refusals and cancels the mix
asks for are counted apart. It prints a table, writes soak.json to --out, and exits 1 on an
unexpected error, a changed probe, or a pool that does not come back to what it held after
the first round (docs/reliability.md).

    python3 tools/soak.py --out OUT                      # 1,000 requests, 4B MLX 4-bit, 4 GiB
    python3 tools/soak.py --backend numpy --model TINY --requests 20 --context 512 \\
        --max-prompt 200 --max-tokens 8 --every 10 --out OUT       # a CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import queue
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.testing.receipt import commit

GIB = 1 << 30
PROMPT_IDS = 400  # random prompts draw ids below this: text in every tokenizer here
CARD_SLACK = 64 << 20  # card bytes the end may hold past the first round's (CuPy's caches)
HOST_SLACK = 1 << 30  # resident host bytes the end may hold past the first round's
EXPECTED = ("ok", "cancelled", "ended before the cancel", "refused: context_length_exceeded")


@dataclass
class Planned:
    index: int
    kind: str  # plain, follow, cancel, over (longer than the context)
    prompt: list[int]
    max_tokens: int
    cancel_after: int = 0  # chunks read before the client goes away


def plan_requests(n: int, every: int, context: int, args, rng) -> list[Planned]:
    """The seeded mix (see the module docstring). A follow-up extends a plain prompt of an
    earlier round, so its saved state is there when it comes."""
    top = max(1, min(args.max_prompt, context - args.max_tokens - 1))  # prompt and reply fit

    def length() -> int:
        r = rng.random()
        lo, hi = (16, 512) if r < 0.75 else (512, 2048) if r < 0.93 else (2048, args.max_prompt)
        hi = max(1, min(hi, top))
        return int(rng.integers(min(lo, hi), hi + 1))

    def ids(k: int) -> list[int]:
        return rng.integers(0, args.vocab, size=k).tolist()

    counts = {"over": max(1, round(0.03 * n)), "cancel": max(1, round(0.05 * n))}
    counts["follow"] = round(0.10 * n)
    kinds = ["plain"] * (n - sum(counts.values()))
    for kind, k in counts.items():
        kinds += [kind] * k
    kinds = [str(k) for k in rng.permutation(kinds[:n])]
    out: list[Planned] = []
    for i, kind in enumerate(kinds):
        earlier = [p for p in out[: i - i % every] if p.kind == "plain"]
        if kind == "follow" and earlier:
            origin = earlier[int(rng.integers(len(earlier)))]
            more = ids(int(rng.integers(8, 129)))
            prompt = (origin.prompt + more)[:top]
        elif kind == "over":
            prompt = ids(context + int(rng.integers(0, 65)))
        else:
            kind = "plain" if kind == "follow" else kind
            prompt = ids(length())
        if kind == "cancel":
            out.append(Planned(i, kind, prompt, args.max_tokens, int(rng.integers(1, 3))))
        else:
            out.append(Planned(i, kind, prompt, int(rng.integers(1, args.max_tokens + 1))))
    return out


def send(client, model: str, item: Planned) -> dict:
    """One streamed completion; what came of it (`outcome`) and the reply's text."""
    body = {
        "model": model,
        "prompt": item.prompt,
        "max_tokens": item.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    import httpx

    got = {"index": item.index, "kind": item.kind, "prompt_tokens": len(item.prompt)}
    text, chunks, tokens = [], 0, None
    t0 = time.perf_counter()
    try:
        with client.stream("POST", "/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                err = response.json().get("error", {})
                kind = err.get("code") or err.get("type")
                return got | refusal(item, f"HTTP {response.status_code} {kind}", err)
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    err = event["error"]
                    kind = err.get("code") or err.get("type")
                    return got | {"outcome": f"error in the stream: {kind}", **message(err)}
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    if choice.get("text"):
                        chunks += 1
                        text.append(choice["text"])
                if item.cancel_after and chunks >= item.cancel_after:
                    return got | {"outcome": "cancelled"}  # the connection closes here
    except httpx.HTTPError as exc:
        return got | {"outcome": f"transport: {type(exc).__name__}", "message": str(exc)[:300]}
    got |= {"text": "".join(text), "seconds": round(time.perf_counter() - t0, 3)}
    if item.kind == "over":
        return got | {"outcome": "served a prompt longer than the context"}
    if tokens != item.max_tokens:
        return got | {"outcome": "wrong length", "message": f"{tokens} of {item.max_tokens}"}
    return got | {"outcome": "ended before the cancel" if item.cancel_after else "ok"}


def refusal(item: Planned, kind: str, err: dict) -> dict:
    if item.kind == "over" and err.get("code") == "context_length_exceeded":
        return {"outcome": "refused: context_length_exceeded"}
    return {"outcome": kind, **message(err)}


def message(err: dict) -> dict:
    return {"message": str(err.get("message", ""))[:300]}


def run_round(url: str, model: str, items: list[Planned], clients: int) -> list[dict]:
    """`items` sent by `clients` threads, each taking the next one when it is done."""
    import httpx

    todo: queue.Queue[Planned] = queue.Queue()
    for item in items:
        todo.put(item)
    results: list[dict] = []
    lock = threading.Lock()

    def client_thread() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            while True:
                try:
                    item = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    result = send(client, model, item)
                except Exception as exc:  # a reply this client cannot read: counted, not lost
                    what = f"client: {type(exc).__name__}"
                    result = {"index": item.index, "outcome": what, "message": str(exc)[:300]}
                with lock:
                    results.append(result)

    threads = [threading.Thread(target=client_thread) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results, key=lambda r: r["index"])


def wait_idle(scheduler, timeout: float = 60.0) -> None:
    """Until no request runs or waits (a cancelled one leaves within a step)."""
    deadline = time.monotonic() + timeout
    while scheduler.running or scheduler.waiting:
        if time.monotonic() > deadline:
            raise RuntimeError("the scheduler did not go idle after a round")
        time.sleep(0.01)


def rss_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory(engine) -> dict:
    """What the engine, the card and the process hold now."""
    pool = engine.backend.pool
    cache = engine.prompt_cache
    out = {
        "engine_held": engine.held_bytes(),
        "pool_held": pool.held_bytes if pool is not None else None,
        "pool_by_category": pool.held_by_category() if pool is not None else {},
        "prompt_cache_bytes": cache.held_bytes,
        "prompt_cache_states": len(cache),
        "rss": rss_bytes(),
        "card_used": None,
        "cupy_pool": None,
    }
    if engine.backend_name == "cuda":
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        out["card_used"] = int(total - free)
        out["cupy_pool"] = int(cupy.get_default_memory_pool().total_bytes())
    return out


def fixed_bytes(reading: dict) -> int:
    """Bytes the engine holds besides its saved prompt states and the scratch and workspace
    (which a lazy plan grows, up to max rows): what must not move at all."""
    if reading["pool_held"] is None:  # the numpy backend: its state and dequantized weights
        return reading["engine_held"]
    by = reading["pool_by_category"]
    grown = sum(by.get(c, 0) for c in ("prompt_cache", "scratch", "workspace"))
    return reading["pool_held"] - grown


def growable_bytes(reading: dict) -> int:
    by = reading["pool_by_category"]
    return by.get("scratch", 0) + by.get("workspace", 0)


def verdict(checkpoints: list[dict], errors: Counter, probes: set[str]) -> list[str]:
    """Why the soak failed (empty: it passed). The readings are compared with the one after
    the first round, when every kernel, graph and cache of a request has been made."""
    problems = [f"{n} unexpected: {kind}" for kind, n in errors.items()]
    if len(probes) > 1:
        problems.append(f"the probe's reply changed: {len(probes)} different replies")
    ref = checkpoints[1] if len(checkpoints) > 2 else checkpoints[0]
    before = ref
    for c in checkpoints[1:]:
        if fixed_bytes(c) != fixed_bytes(ref):
            problems.append(
                f"after {c['after']}: the engine holds {fixed_bytes(c):,} bytes besides its "
                f"saved states, scratch and workspace; after round one {fixed_bytes(ref):,}"
            )
        if growable_bytes(c) < growable_bytes(before):
            problems.append(f"after {c['after']}: the scratch and workspace shrank")
        before = c
    end = checkpoints[-1]
    if end["prompt_cache_bytes"] or end["pool_by_category"].get("prompt_cache"):
        problems.append("the prompt cache holds memory after it was emptied")
    if end["card_used"] is not None and end["card_used"] > ref["card_used"] + CARD_SLACK:
        grown = (end["card_used"] - ref["card_used"]) / GIB
        problems.append(f"the card's used memory grew {grown:.3f} GiB from round one")
    if end["rss"] is not None and ref["rss"] is not None and end["rss"] > ref["rss"] + HOST_SLACK:
        grown = (end["rss"] - ref["rss"]) / GIB
        problems.append(f"the process's resident memory grew {grown:.3f} GiB from round one")
    return problems


def gib(x: int | None) -> str:
    return "-" if x is None else f"{x / GIB:.3f}"


def table(checkpoints: list[dict], totals: Counter, meta: dict) -> str:
    lines = [
        f"GPU: {meta['gpu']}; backend {meta['backend']}; commit {meta['commit']}; "
        f"{meta['date']}; model {meta['model']}; limit {meta['limit_gib']} GiB; context "
        f"{meta['context']}, {meta['streams']} streams, {meta['clients']} clients; "
        f"{meta['requests']} requests in {meta['wall_s']:.0f} s",
        "",
        "| after | requests | unexpected errors | pool GiB (saved states) | card used GiB | "
        "CuPy pool GiB | process RSS GiB | saved states |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in checkpoints:
        saved = c["pool_by_category"].get("prompt_cache", 0) or c["prompt_cache_bytes"]
        lines.append(
            f"| {c['after']} | {c['requests']} | {c['errors']} | {gib(c['pool_held'])} "
            f"({gib(saved)}) | {gib(c['card_used'])} | {gib(c['cupy_pool'])} | "
            f"{gib(c['rss'])} | {c['prompt_cache_states']} |"
        )
    lines += ["", "| outcome | requests |", "|---|---|"]
    for kind, n in sorted(totals.items()):
        lines.append(f"| {kind}{'' if kind in EXPECTED else ' (unexpected)'} | {n} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", help="checkpoint folder")
    src.add_argument("--synth", default="4B:mlx4", help="a random checkpoint at a real shape")
    p.add_argument("--workdir", default="/tmp/snug-bench", help="where --synth writes it")
    p.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="cuda")
    p.add_argument("--limit-gib", type=float, default=4.0, help="0: no limit")
    p.add_argument("--reserve-gib", type=float, default=None)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--context", type=int, default=None, help="default: the largest admitted")
    p.add_argument("--max-rows", type=int, default=None, help="default: the plan's")
    p.add_argument("--max-prompt", type=int, default=6000)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--every", type=int, default=100, help="requests between memory readings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None)
    p.add_argument("--out", default=".", help="folder for soak.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from engine.config import EngineSettings
    from engine.device import probe_gpu
    from engine.scheduler import Scheduler
    from engine.server.app import create_app
    from engine.server.runner import ServerThread
    from engine.session import Engine

    args = parse_args(argv)
    settings = EngineSettings.from_env().with_gib(reserve=args.reserve_gib, limit=args.limit_gib)
    # No disk tier: what the soak reads is memory.
    settings = dataclasses.replace(settings, backend=args.backend, prompt_cache_dir=None)
    if args.model:
        path = Path(args.model)
    else:
        from engine.testing.synth import model_dir

        shape, fmt = args.synth.split(":")
        path = model_dir(args.workdir, shape, fmt)
    t = time.perf_counter()
    engine = Engine.load(
        path, settings, context=args.context, streams=args.streams, max_rows=args.max_rows
    )
    load_s = time.perf_counter() - t
    if engine.decision is not None:
        print(engine.decision.format_table(), flush=True)
    args.vocab = min(engine.vocab_rows, PROMPT_IDS)
    rng = np.random.default_rng(args.seed)
    items = plan_requests(args.requests, args.every, engine.context, args, rng)
    probe = Planned(-1, "probe", rng.integers(0, args.vocab, size=48).tolist(), 16)
    scheduler = Scheduler(engine, queue_size=max(args.clients, 1)).start()
    server = ServerThread(create_app(scheduler)).start()
    gpu = probe_gpu()
    meta = {
        "gpu": gpu.name if gpu is not None else "none (CPU)",
        "backend": engine.backend_name,
        "commit": commit(args.commit),
        "date": time.strftime("%Y-%m-%d"),
        "model": str(path),
        "limit_gib": (args.limit_gib or None) if engine.backend.pool is not None else None,
        "context": engine.context,
        "streams": engine.streams,
        "max_rows": engine.max_rows,
        "clients": args.clients,
        "requests": args.requests,
        "load_s": round(load_s, 2),
        "plan": engine.decision.to_dict() if engine.decision is not None else None,
    }
    import httpx

    totals, errors, samples, probes = Counter(), Counter(), {}, set()
    checkpoints = [{"after": "load", "requests": 0, "errors": 0, **memory(engine)}]
    stopped = None  # why the soak ended before its last round
    t0 = time.perf_counter()
    try:
        with httpx.Client(base_url=server.url, timeout=600) as client:
            for start in range(0, len(items), args.every):
                results = run_round(
                    server.url, path.name, items[start : start + args.every], args.clients
                )
                for r in results:
                    totals[r["outcome"]] += 1
                    if r["outcome"] not in EXPECTED:
                        errors[r["outcome"]] += 1
                        samples.setdefault(r["outcome"], r.get("message", ""))
                wait_idle(scheduler)
                reply = send(client, path.name, probe)
                if reply["outcome"] != "ok":
                    errors[f"probe: {reply['outcome']}"] += 1
                probes.add(reply.get("text", ""))
                wait_idle(scheduler)
                done = start + len(results)
                reading = {"after": f"{done} requests", "requests": done}
                checkpoints.append(reading | {"errors": sum(errors.values()), **memory(engine)})
                print(json.dumps(checkpoints[-1]), flush=True)
    except Exception as exc:  # reported with what was read until then
        stopped = f"the soak stopped: {type(exc).__name__}: {exc}"
    finally:
        server.stop()
        scheduler.close()
    wall = time.perf_counter() - t0
    engine.prompt_cache.clear()
    final = {"after": "the end, prompt cache emptied", "requests": len(items)}
    checkpoints.append(final | {"errors": sum(errors.values()), **memory(engine)})
    meta["wall_s"] = round(wall, 1)
    problems = ([stopped] if stopped else []) + verdict(checkpoints, errors, probes)
    print()
    print(table(checkpoints, totals, meta))
    stats = engine.prompt_cache.stats
    print(
        f"\nprompt cache: {sum(stats.hits.values())} hits {stats.hits}, {stats.misses} misses, "
        f"{stats.saved} saved; scheduler: {dataclasses.asdict(scheduler.stats)}"
    )
    for kind, text in samples.items():
        print(f"- {kind}: {text}")
    print("\nFAIL" if problems else "\nPASS: memory flat, no unexpected error")
    for line in problems:
        print(f"- {line}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = meta | {
        "checkpoints": checkpoints,
        "outcomes": dict(totals),
        "errors": dict(errors),
        "error_samples": samples,
        "probe_replies": len(probes),
        "prompt_cache": dataclasses.asdict(stats),
        "scheduler": dataclasses.asdict(scheduler.stats),
        "problems": problems,
    }
    (out / "soak.json").write_text(json.dumps(record, indent=1, default=str))
    engine.unload()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
