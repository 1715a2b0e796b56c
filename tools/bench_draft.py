"""Drafting with the MTP head: what a verify costs against a decode step, and the speed-up.

Loads a random checkpoint at a real shape with its MTP head (Hugging Face bf16 layout,
engine/testing/synth.py) through `Engine.load` with drafting on, prefills a prompt, and
measures at that position, on one stream:

    step      one decode step as a reply runs it (the captured decode graph on a GPU)
    verify k  one verify forward of k + 1 rows with every row's logits and final hidden
              state, and the host's picks (targets: <= 1.15x, 1.25x, 1.35x a step for
              k = 1, 2, 3)
    draft     one chained draft of the MTP head (its layer and the LM head), and the head
              over the k + 1 rows a round with every draft kept hands it

Then replies: plain (no drafter), and with drafts forced to the plain reply's own tokens
(every draft kept: the upper bound), k = 1, 2, 3. Random weights keep almost no draft of
the head's own, so the projected speed-up uses the forced rounds' measured cost with the
tokens a round gives at the acceptance published for Qwen3.5's MTP head (about 0.85 at the
first position; `--acceptance` takes one rate for every position or one per position).
Target: >= 1.6x projected at k = 2. Last, a round's cost as warm-up times it for "auto"
(`Drafter.measure`), greedy and sampled: a sampled reply's round waits for each draft and
draws it on the host.

    python3 tools/bench_draft.py --shape 4B --out OUT          (GPU)
    python3 tools/bench_draft.py --shape 4B --profile --out OUT   (and each forward's kernels)
    SNUG_MEMORY_LIMIT_GIB=4 python3 tools/bench_draft.py --shape 0.8B --out OUT   (a 4 GiB card)
    python3 tools/bench_draft.py --backend numpy --shape tiny --prompt 64 --steps 32 (smoke)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.backends.base import Batch
from engine.config import EngineSettings
from engine.drafting import DraftPolicy, draft_cost
from engine.session import Engine, GenerationParams
from engine.testing.synth import model_dir

TARGETS = {1: 1.15, 2: 1.25, 3: 1.35}  # verify k / step, at most
PROJECTED_TARGET = 1.6  # at k = 2


def timed(fn, reps: int) -> float:
    """Median seconds of `fn()` (which waits for its own result), after one warm call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_costs(engine: Engine, prompt: list[int], reps: int) -> dict:
    """Seconds of a step, of verifies of k + 1 rows, of the head's forwards, at the
    prompt's end on stream 0."""
    be, model, head = engine.backend, engine.model, engine.drafter.head
    stream = engine._open_stream()
    try:
        engine.prefill(stream, prompt)
        n, tok = len(stream.ids), np.asarray([prompt[-1]])

        def step():
            logits, greedy = be.decode_step(model, Batch.step([(stream.slot, n)]), tok)
            return greedy.get() if greedy is not None else be.argmax_rows(logits)

        out = {"position": n, "step_s": timed(step, reps), "verify_s": {}, "head_window_s": {}}
        for k in (1, 2, 3):
            ids = np.asarray([prompt[-1]] * (k + 1))

            def verify(k=k, ids=ids):
                batch = Batch.verify(stream.slot, n, k + 1)
                logits, _ = be.verify_forward(model, batch, ids)
                return be.argmax_rows(logits)

            out["verify_s"][k] = timed(verify, reps)
            held = be.hold_rows(model.hidden, np.arange(k + 1))

            def window(k=k, ids=ids, held=held):
                batch = Batch.window(stream.slot, n - 1, k + 1)
                last = np.array([k], np.int32)
                return be.argmax_rows(be.head_forward(head, batch, ids, held, last))

            out["head_window_s"][k] = timed(window, reps)
        one = be.hold_rows(model.hidden, np.array([0]))

        def draft():
            batch = Batch.window(stream.slot, n, 1)
            return be.argmax_rows(be.head_forward(head, batch, tok, one, np.zeros(1, np.int32)))

        out["draft_s"] = timed(draft, reps)
    finally:
        engine._close_stream(stream)
    return out


def replies(engine: Engine, prompt: list[int], steps: int) -> dict:
    """Decode tokens/s: plain, then with drafts forced to the plain reply (k = 1, 2, 3)."""
    drafter = engine.drafter
    params = GenerationParams(max_new_tokens=steps, greedy=True)

    def run():
        engine.prompt_cache.clear()
        events = list(engine.generate(prompt, params))
        return [e.token_id for e in events], events[-1].stats

    engine.drafter = None  # plain: the pipelined decode path a reply takes without drafts
    plain, stats = run()
    engine.drafter = drafter
    out = {"plain_tok_s": stats.decode_tok_s, "tokens": len(plain), "forced": {}}
    cost = draft_cost(engine.checkpoint.tensors, engine.config.tie_word_embeddings)
    for k in (1, 2, 3):
        drafter.policy = DraftPolicy(k, auto=False, draft_cost=cost)
        # In half precision the verify window's kernels may break a near-tie the step's
        # kernels broke the other way: the drafts are then forced to the drafted reply
        # itself (every draft kept), found in at most three tries.
        target = plain
        for _ in range(3):
            drafter.forced = target
            rounds = drafter.stats.rounds
            forced, stats = run()
            if forced == target:
                break
            target = forced
        else:
            raise SystemExit(f"k = {k}: the forced reply does not settle")
        n_rounds = drafter.stats.rounds - rounds
        decode_s = (stats.new_tokens - 1) / stats.decode_tok_s
        out["forced"][k] = {
            "tok_s": stats.decode_tok_s,
            "speedup": stats.decode_tok_s / out["plain_tok_s"],
            "round_s": decode_s / max(n_rounds, 1),
            "rounds": n_rounds,
            "equals_plain": forced == plain,
        }
    drafter.forced = None
    return out


def projected(rates: list[float], k: int, round_s: float, plain_tok_s: float) -> float:
    """Speed-up of rounds of k drafts costing `round_s` each, drafts kept at `rates`
    (position i kept with rates[i] given the ones before it were)."""
    tokens, keep = 1.0, 1.0
    for i in range(k):
        keep *= rates[min(i, len(rates) - 1)]
        tokens += keep
    return tokens / round_s / plain_tok_s


def _instance(name: str) -> str:
    """A kernel's family (tools/profile_step.family), with the projections' template
    arguments kept: their row count is what a verify changes."""
    from tools.profile_step import family

    base = family(name)
    name = name.removeprefix("void ").strip()
    if base in ("gemv", "gemv4") and "<" in name:
        return name[: name.index(">") + 1]
    return base


def profile_forwards(engine: Engine, prompt: list[int], reps: int) -> dict[str, dict]:
    """Kernel figures (GPU): each kernel's microseconds per call of a step and of a verify
    of k + 1 rows (k = 1, 2, 3) at the prompt's end, from CUPTI as torch's profiler drives
    it over `reps` calls of each. For finding where a verify's time goes, not its cost
    (`forward_costs` times that)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    be, model = engine.backend, engine.model
    stream = engine._open_stream()
    out: dict[str, dict] = {}
    try:
        engine.prefill(stream, prompt)
        n, tok = len(stream.ids), np.asarray([prompt[-1]])
        runs = {"step": lambda: be.decode_step(model, Batch.step([(stream.slot, n)]), tok)}
        for k in (1, 2, 3):
            ids = np.asarray([prompt[-1]] * (k + 1))
            batch = Batch.verify(stream.slot, n, k + 1)
            runs[f"verify {k}"] = lambda b=batch, i=ids: be.verify_forward(model, b, i)
        torch.cuda.init()
        trace = Path("/tmp/snug-draft-trace.json")
        for name, run in runs.items():
            run()  # captured and warm before the trace
            be.stream.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    run()
                be.stream.synchronize()
            prof.export_chrome_trace(str(trace))
            events = json.loads(trace.read_text())["traceEvents"]
            per: dict[str, list[float]] = {}
            for e in events:
                if e.get("cat") == "kernel":
                    acc = per.setdefault(_instance(e["name"]), [0.0, 0.0])
                    acc[0] += 1 / reps
                    acc[1] += float(e["dur"]) / reps
            out[name] = {fam: {"launches": a[0], "us": a[1]} for fam, a in per.items()}
    finally:
        engine._close_stream(stream)
    return out


def profile_table(prof: dict[str, dict], top: int = 30) -> str:
    """Kernel microseconds per call by family, step against verifies, largest in the
    verify of 4 rows first."""
    cols = list(prof)
    last = prof[cols[-1]]
    every = {f for p in prof.values() for f in p}
    fams = sorted(every, key=lambda f: -last.get(f, {}).get("us", 0))
    lines = [
        "Kernel figures (CUPTI; for finding where time goes): microseconds a call, launches in "
        "brackets",
        "",
        "| kernel | " + " | ".join(cols) + " |",
        "| --- |" + " --- |" * len(cols),
    ]
    for fam in fams[:top]:
        cells = []
        for c in cols:
            v = prof[c].get(fam)
            cells.append(f"{v['us']:.1f} ({v['launches']:.0f})" if v else "-")
        lines.append(f"| `{fam[:60]}` | " + " | ".join(cells) + " |")
    totals = [sum(v["us"] for v in prof[c].values()) for c in cols]
    lines.append("| **all kernels** | " + " | ".join(f"**{t:.1f}**" for t in totals) + " |")
    return "\n".join(lines)


def table(r: dict, rates: list[float]) -> str:
    costs, reply = r["costs"], r["replies"]
    step = costs["step_s"]
    lines = [
        f"{r['shape']} bf16 + MTP, {r['backend']} ({r['dtype']}), {r.get('card', 'whole card')}, "
        f"position {costs['position']}: step {step * 1e3:.3f} ms, "
        f"draft {costs['draft_s'] / step:.2f}x a step, plain {reply['plain_tok_s']:.1f} tok/s",
        "",
        "| k | verify / step (target) | head window / step | round / step, every draft kept "
        "| speed-up, every draft kept | projected speed-up at " + ",".join(map(str, rates)) + " |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for k in (1, 2, 3):
        v = costs["verify_s"][k] / step
        f = reply["forced"][k]
        p = projected(rates, k, f["round_s"], reply["plain_tok_s"])
        ok = "ok" if v <= TARGETS[k] else "over"
        lines.append(
            f"| {k} | {v:.2f}x (<= {TARGETS[k]}x: {ok}) | {costs['head_window_s'][k] / step:.2f}x "
            f"| {f['round_s'] / step:.2f}x | {f['speedup']:.2f}x | {p:.2f}x |"
        )
    k2 = projected(rates, 2, reply["forced"][2]["round_s"], reply["plain_tok_s"])
    verdict = "ok" if k2 >= PROJECTED_TARGET else "short"
    lines += ["", f"projected at k = 2: {k2:.2f}x (target >= {PROJECTED_TARGET}x: {verdict})"]
    if "load_rounds" in r:
        lines += ["", load_rounds_table(r["load_rounds"], rates)]
    return "\n".join(lines)


def load_rounds_table(rounds: dict[str, dict[int, float]], rates: list[float]) -> str:
    """A round's cost as warm-up times it for "auto" (`Drafter.measure`: one stream on slot
    0, in decode steps), greedy and sampled, and the tokens a step it would give at `rates`."""
    lines = [
        "A round as warm-up times it for auto (decode steps; tokens a step at "
        + ",".join(map(str, rates))
        + ")",
        "",
        "| k | greedy round | greedy tokens / step | sampled round | sampled tokens / step |",
        "| --- | --- | --- | --- | --- |",
    ]
    for k in sorted(rounds["greedy"]):
        g, sm = rounds["greedy"][k], rounds["sampled"][k]
        t = projected(rates, k, 1.0, 1.0)  # tokens a round
        lines.append(f"| {k} | {g:.2f} | {t / g:.2f} | {sm:.2f} | {t / sm:.2f} |")
    return "\n".join(lines)


def load_rounds(engine: Engine) -> dict[str, dict[int, float]]:
    """`Drafter.measure` for greedy and sampled rounds (slot 0, reset after)."""
    drafter = engine.drafter
    engine.prompt_cache.clear()
    try:
        return {
            "greedy": drafter.measure(),
            "sampled": drafter.measure(sampled=True, reps=2),
        }
    finally:
        engine.backend.reset_slot(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4B", help="0.8B, 2B, 4B, 9B or tiny")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "numpy"])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens before the timing")
    ap.add_argument("--steps", type=int, default=256, help="tokens of each timed reply")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20, help="timed calls per forward figure")
    ap.add_argument("--acceptance", default="0.85", help="kept rate, or one per position")
    ap.add_argument("--workdir", default="/tmp/snug-bench")
    ap.add_argument("--out", default=".")
    ap.add_argument(
        "--profile", action="store_true", help="also trace a step's and each verify's kernels"
    )
    args = ap.parse_args()
    if args.profile and args.backend != "cuda":
        raise SystemExit("--profile traces CUDA kernels: it needs --backend cuda")

    rates = [float(x) for x in args.acceptance.split(",")]
    path = model_dir(args.workdir, args.shape, "bf16", seed=1, mtp=True)
    # SNUG_MEMORY_LIMIT_GIB (and the other SNUG_* settings) simulate a small card
    settings = replace(
        EngineSettings.from_env(), backend=args.backend, compute_dtype=args.dtype, draft_tokens="3"
    )
    engine = Engine.load(path, settings, context=args.context)
    if engine.drafter is None:
        raise SystemExit(f"no drafting: {engine.drafting}")
    prompt = np.random.default_rng(0).integers(0, 400, size=args.prompt).tolist()
    result = {
        "shape": args.shape,
        "backend": engine.backend_name,
        "dtype": args.dtype if args.backend == "cuda" else "float32",
        "acceptance": rates,
        "card": "whole card"
        if settings.limit_bytes is None
        else f"limit {settings.limit_bytes / 2**30:g} GiB",
        "costs": forward_costs(engine, prompt, args.reps),
        "replies": replies(engine, prompt, args.steps),
    }
    result["load_rounds"] = load_rounds(engine)
    text = table(result, rates)
    if args.profile:
        result["profile"] = profile_forwards(engine, prompt, args.reps)
        text += "\n\n" + profile_table(result["profile"])
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft.json").write_text(json.dumps(result, indent=1))
    (out / "draft.md").write_text(text + "\n")
    engine.unload()


if __name__ == "__main__":
    main()
