"""A prompt sent again whole (Regenerate, `n` replies, a client's retry): its first token.

Through `Engine.load` and `Engine.generate`, as the app calls them, greedy, --new-tokens a
reply (end of sequence ignored). For each memory limit (--limits: `none` is the whole card)
and each prompt length, two prompts of random ids: a chat's (ending in the assistant
header `<|im_start|>assistant\\n`, where its last turn begins) and a raw one (no header).
Each is timed three ways, --repeats times each (the median is shown):

    first    the prompt read with the prompt cache emptied first
    again    the same prompt sent again: restored from the state saved at its end, its
             first token picked from the logits kept with it (no forward)
    reread   the same with the kept logits set aside: a chat's prompt restores its last
             turn's start and reads the header again, a raw prompt is read whole

`whole` counts the restores that needed no forward; `same` says whether the three replies
were one. Prints a table and writes repeat.json to --out.

    python3 tools/bench_repeat.py --out OUT                      # 4B MLX 4-bit, whole / 4 GiB
    python3 tools/bench_repeat.py --backend numpy --shape tiny --prompts 64 \\
        --limits none --new-tokens 4 --out OUT                   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

PROMPT_IDS = 400  # random ids below this: text in every tokenizer here


def model_path(args: argparse.Namespace) -> Path:
    if args.shape == "tiny":
        from engine.testing.tiny import build_checkpoint

        path = Path(args.workdir) / "tiny-repeat"
        if not (path / "tokenizer.json").exists():
            build_checkpoint("tied-l8-r4-hd64", "hf-fp32", path)
        return path
    from engine.testing.synth import model_dir

    return model_dir(args.workdir, args.shape, args.format)


def prompts(engine, length: int, seed: int) -> dict[str, list[int]]:
    """A chat-shaped prompt and a raw one, `length` ids each."""
    tok = engine.tokenizer
    header = [tok.token_to_id("<|im_start|>"), *tok.encode("assistant\n")]
    ids = np.random.default_rng(seed).integers(0, PROMPT_IDS, size=length).tolist()
    return {"chat": ids[: length - len(header)] + header, "raw": ids}


def timed(engine, ids: list[int], params) -> tuple[float, list[int]]:
    """Time to the first token, and the reply's tokens."""
    t0, first, out = time.perf_counter(), None, []
    for event in engine.generate(ids, params):
        if first is None:
            first = time.perf_counter() - t0
        out.append(event.token_id)
    return first or 0.0, out


def run_limit(args: argparse.Namespace, limit: float | None) -> list[dict]:
    from engine.config import EngineSettings
    from engine.session import Engine, GenerationParams

    settings = EngineSettings(backend=args.backend)
    if limit is not None:
        settings = settings.with_gib(reserve=args.reserve_gib, limit=limit)
    longest = max(args.prompts) + 2 * args.new_tokens + 64
    engine = Engine.load(model_path(args), settings, context=longest)
    engine.eos_ids = frozenset()  # random weights may pick an end token: every reply runs
    params = GenerationParams(max_new_tokens=args.new_tokens, greedy=True)
    cache, rows = engine.prompt_cache, []
    timed(engine, prompts(engine, 64, seed=99)["raw"], params)  # the first request's costs
    try:
        for length in args.prompts:
            for kind, ids in prompts(engine, length, seed=length).items():
                times: dict[str, list[float]] = {"first": [], "again": [], "reread": []}
                replies, whole = set(), cache.stats.whole
                for _ in range(args.repeats):
                    cache.clear()
                    for way in times:
                        if way == "reread":
                            engine._restore_end = lambda stream, ids: None  # logits set aside
                        took, reply = timed(engine, ids, params)
                        engine.__dict__.pop("_restore_end", None)
                        times[way].append(took)
                        replies.add(tuple(reply))
                row = {way: statistics.median(t) for way, t in times.items()}
                row |= {"kind": kind, "length": length, "limit_gib": limit}
                row |= {"whole": cache.stats.whole - whole, "same": len(replies) == 1}
                row["saves_at_prompt_end"] = engine.backend.cheap_snapshots
                rows.append(row)
                print(line(row), flush=True)
    finally:
        engine.unload()
    return rows


HEAD = "limit    prompt  tokens   first s   again s  reread s  whole  same"


def line(row: dict) -> str:
    limit = "none" if row["limit_gib"] is None else f"{row['limit_gib']:g} GiB"
    return (
        f"{limit:<8} {row['kind']:<6} {row['length']:>7,} {row['first']:>9.4f} "
        f"{row['again']:>9.4f} {row['reread']:>9.4f} {row['whole']:>6} {str(row['same']):>5}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="4B", help="a synth shape, or tiny")
    ap.add_argument("--format", default="mlx4")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "numpy", "auto"))
    ap.add_argument("--limits", default="none,4", help="GiB, comma-separated; none: the card")
    ap.add_argument("--reserve-gib", type=float, default=0.5)
    ap.add_argument("--prompts", default="512,8192", help="prompt lengths, comma-separated")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default="/tmp/snug-bench")
    ap.add_argument("--out", default=".")
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args(argv)
    args.prompts = [int(x) for x in args.prompts.split(",")]
    limits = [None if x == "none" else float(x) for x in args.limits.split(",")]
    print(HEAD, flush=True)
    rows = [row for limit in limits for row in run_limit(args, limit)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"commit": args.commit, "date": time.strftime("%Y-%m-%d"), "shape": args.shape}
    meta |= {"format": args.format, "backend": args.backend, "new_tokens": args.new_tokens}
    (out / "repeat.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
