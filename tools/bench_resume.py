"""The next turn of a long conversation after a restart: its time to the first token.

Three processes (this script with --step), as the app lives through a restart:

    save      `Engine.load` with the prompt cache's disk tier in a fresh folder, a first turn
              of --history random prompt tokens and --new-tokens of reply; `unload` finishes
              the disk writes (the state at the reply's end is on disk)
    resume    a new process: `Engine.load` on the same folder, then the next turn (the
              history, the reply and --follow-up more tokens) through `Engine.generate`:
              where its state came from, its time to the first token (and of it, the
              restore's: reading and checking the saved file, and `restore_slot`), and
              its tokens; then the same length of fresh ids (no saved state matches): the
              time a full prefill takes in the same process
    fresh     a new process with no prompt cache: the next turn prefilled whole; its tokens

and resumed = fresh holds when the resume's tokens equal the fresh process's (run it with
--dtype float32: in half precision a restored state equals the uninterrupted one bit for bit
but a whole prefill runs other windows). All greedy, end of sequence ignored. Prints a table
and writes resume.json to --out.

    python3 tools/bench_resume.py --out OUT                      # 4B MLX 4-bit, 16K history
    python3 tools/bench_resume.py --dtype float32 --out OUT      # resumed = fresh
    python3 tools/bench_resume.py --backend numpy --shape tiny --history 300 \\
        --new-tokens 8 --follow-up 20 --out OUT                  # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PROMPT_IDS = 400  # random ids below this: text in every tokenizer here


def load(args: argparse.Namespace, cache_dir: str | None):
    from engine.config import EngineSettings
    from engine.session import Engine
    from engine.testing.synth import model_dir

    settings = EngineSettings(backend=args.backend, compute_dtype=args.dtype)
    settings = replace(settings, prompt_cache_dir=cache_dir)
    if args.shape == "tiny":
        from engine.testing.tiny import build_checkpoint

        path = Path(args.workdir) / "tiny-resume"
        if not (path / "tokenizer.json").exists():
            build_checkpoint("tied-l8-r4-hd64", "hf-fp32", path)
    else:
        path = model_dir(args.workdir, args.shape, args.format)
    context = args.history + 2 * args.new_tokens + args.follow_up + 64
    engine = Engine.load(path, settings, context=context, max_rows=args.max_rows)
    engine.eos_ids = frozenset()  # random weights: every reply has its length
    return engine


def turns(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """The first turn's prompt and the follow-up's extra ids (seeded)."""
    rng = np.random.default_rng(args.seed)
    return (
        rng.integers(0, PROMPT_IDS, args.history).tolist(),
        rng.integers(0, PROMPT_IDS, args.follow_up).tolist(),
    )


def reply(engine, prompt: list[int], n: int) -> tuple[list[int], float]:
    from engine.session import GenerationParams

    events = list(engine.generate(prompt, GenerationParams(max_new_tokens=n, greedy=True)))
    return [e.token_id for e in events], events[-1].stats.ttft_s


def step(args: argparse.Namespace) -> dict:
    """One of the three processes (the module docstring); returns what it measured."""
    first, extra = turns(args)
    if args.step == "save":
        engine = load(args, args.cache_dir)
        tokens, ttft = reply(engine, first, args.new_tokens)
        t = time.perf_counter()
        engine.unload()  # the disk writes finish here
        return {"reply": tokens, "ttft_s": ttft, "unload_s": time.perf_counter() - t}
    follow = first + args.reply + extra
    if args.step == "resume":
        t = time.perf_counter()
        engine = load(args, args.cache_dir)
        load_s = time.perf_counter() - t
        where = engine.prompt_cache.where(follow)
        tokens, ttft = reply(engine, follow, args.new_tokens)
        stats = engine.prompt_cache.stats
        timing = stats.last_restore
        other = np.random.default_rng(args.seed + 1).integers(0, PROMPT_IDS, len(follow))
        _, full = reply(engine, other.tolist(), 2)
        engine.unload()
        return {
            "load_s": load_s,
            "restored_from": where[0] if where else None,
            "restored_tokens": len(where[1]) if where else 0,
            "hits": dict(stats.hits),
            "restore_read_s": timing.read_s if timing else None,
            "restore_slot_s": timing.slot_s if timing else None,
            "ttft_s": ttft,
            "tokens": tokens,
            "full_prefill_ttft_s": full,
        }
    engine = load(args, None)
    tokens, ttft = reply(engine, follow, args.new_tokens)
    engine.unload()
    return {"tokens": tokens, "ttft_s": ttft}


def run_step(args: argparse.Namespace, name: str, cache_dir: str, reply_ids: list[int]) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", name, "--cache-dir", cache_dir]
    cmd += ["--reply", ",".join(map(str, reply_ids))] if reply_ids else []
    for flag in ("shape", "format", "backend", "dtype", "history", "new_tokens", "follow_up"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--max-rows", str(args.max_rows)] if args.max_rows else []
    cmd += ["--seed", str(args.seed), "--workdir", args.workdir]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the {name} step failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(res: dict) -> str:
    r, f = res["resume"], res["fresh"]
    same = r["tokens"] == f["tokens"]
    lines = [
        f"{res['shape']} {res['format']}, {res['backend']} ({res['dtype']}): a history of "
        f"{res['history']:,} tokens and {res['new_tokens']} of reply, then {res['follow_up']} "
        "more in a new process",
        "",
        "| next turn | restored from | time to first token | tokens equal to a fresh prefill |",
        "| --- | --- | --- | --- |",
        f"| resumed after a restart | {r['restored_from']} ({r['restored_tokens']:,} tokens) | "
        f"{r['ttft_s'] * 1e3:.1f} ms | {'yes' if same else 'no'} ({len(r['tokens'])} tokens) |",
        f"| the same length, nothing saved (same process) | - | "
        f"{r['full_prefill_ttft_s'] * 1e3:.1f} ms | - |",
        f"| fresh process, no prompt cache | - | {f['ttft_s'] * 1e3:.1f} ms | - |",
        "",
        f"load of the resuming process {r['load_s']:.2f} s; the first turn's unload (disk "
        f"writes) {res['save']['unload_s']:.2f} s",
    ]
    if r.get("restore_read_s") is not None:
        lines.append(
            f"of the resumed turn's time to first token, the restore: reading and checking "
            f"the saved file {r['restore_read_s'] * 1e3:.1f} ms, `restore_slot` "
            f"{r['restore_slot_s'] * 1e3:.1f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4B", help="a synth shape, or tiny")
    ap.add_argument("--format", default="mlx4")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "numpy", "auto"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--history", type=int, default=16_000)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--follow-up", type=int, default=40)
    ap.add_argument("--max-rows", type=int, default=None, help="default: the plan's")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", default="/tmp/snug-bench")
    ap.add_argument("--out", default=".")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--step", choices=("save", "resume", "fresh"), help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", help=argparse.SUPPRESS)
    ap.add_argument("--reply", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.reply = [int(x) for x in args.reply.split(",") if x]
    if args.shape == "tiny":
        args.format = "hf-fp32"  # the tiny checkpoint's format
    if args.backend == "numpy":
        args.dtype = "float32"  # what the numpy backend computes in
    if args.step:
        print(json.dumps(step(args)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="snug-resume-") as cache_dir:
        save = run_step(args, "save", cache_dir, [])
        resume = run_step(args, "resume", cache_dir, save["reply"])
    with tempfile.TemporaryDirectory(prefix="snug-fresh-") as nothing:
        fresh = run_step(args, "fresh", nothing, save["reply"])
    res = {
        "commit": args.commit,
        "date": time.strftime("%Y-%m-%d"),
        **{k: getattr(args, k) for k in ("shape", "format", "backend", "dtype", "history")},
        "new_tokens": args.new_tokens,
        "follow_up": args.follow_up,
        "save": save,
        "resume": resume,
        "fresh": fresh,
        "resumed_equals_fresh": resume["tokens"] == fresh["tokens"],
    }
    print(table(res), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "resume.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
