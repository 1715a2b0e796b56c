"""Micro-benchmark of token selection on the device (CUDA backend, GPU only).

Times the greedy pick and the top-k / top-p draw over one row of a 248,320-token vocabulary
(Qwen3.5's), in each form the backend has: the narrow draw (one logit a thread at a time), the
wide one-block draw, and the split draw (draw_candidates over 128 blocks, then the draw's
block), at top-k 20 (the app's default), 50 and 1024, with a presence penalty. Two figures a
case: back-to-back launches from the host (what a loop of Python calls gets; short kernels
are bound by the host's launch cost there) and the same calls captured in a CUDA graph and
replayed (the GPU's own time a call). Prints a markdown table, writes draw_bench.json.

    PYTHONPATH=. python3 tools/bench_draw.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from engine.backends.cuda.backend import CudaBackend
from engine.backends.cuda.gemv import best_replay_s
from engine.backends.cuda.launch import on_stream
from engine.backends.cuda.sample_ops import draw_buffers
from engine.backends.cuda.synth import to_bf16
from engine.sampling import Draw

MODES = {  # name: (wide_sampler, split_draw_min)
    "narrow": (False, 0),
    "wide": (True, 0),
    "split": (True, 1 << 16),
}
DEFAULTS = [Draw(0.7, 20, 0.8, 1, 1.5, 0)]  # the app's sampling defaults, one row


def backend(dtype: str, vocab: int, rows: np.ndarray):
    import cupy

    be = CudaBackend(dtype=dtype)
    be.nvalid = vocab
    be.picks = cupy.zeros(8, cupy.int32)
    be.seen = cupy.zeros((2, -(-vocab // 32)), cupy.uint32)
    be.seen[0, ::7] = 0x01010101  # some ids already said: the penalty has work to do
    be.argmax_work = cupy.zeros(2, cupy.uint64)
    be.draw_cand = draw_buffers()
    if dtype == "bfloat16":
        logits = cupy.asarray(to_bf16(rows))
    else:
        logits = cupy.asarray(rows.astype(be.ops.act_dtype))
    return be, logits


def timed(be, fn, calls: int, reps: int) -> tuple[float, float]:
    """(us a call launched back to back from the host, us a call replayed in a graph)."""
    import cupy

    stream = be.stream
    with on_stream(stream):
        for _ in range(5):  # compiles, and warms the caches
            fn()
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        for _ in range(calls):
            fn()
        e1.record(stream)
        e1.synchronize()
        host = cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / calls
        be.ops.graphing = True  # launched as inside a decode graph
        stream.begin_capture()
        try:
            for _ in range(calls):
                fn()
        finally:
            graph = stream.end_capture()
            be.ops.graphing = False
        graph.upload(stream)
        return host, best_replay_s(graph, stream, reps) * 1e6 / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--top-k", default="20,50,1024")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((1, args.vocab)).astype(np.float32) * 2
    rows[0, rng.integers(0, args.vocab, 8)] += 14  # a few far leaders, as a trained model has
    be, logits = backend(args.dtype, args.vocab, rows)
    out = be.picks[:1]
    results = []

    def run(case: str, fn) -> None:
        host, graph = timed(be, fn, args.calls, args.reps)
        results.append({"case": case, "host_us": round(host, 2), "graph_us": round(graph, 2)})
        print(f"| {case} | {host:.1f} | {graph:.1f} |", flush=True)

    print("| case | us a call, host launches | us a call, graph |\n|---|---|---|")
    run("greedy (argmax_split)", lambda: be.ops.argmax(logits, args.vocab, out, be.argmax_work))
    for name, (wide, split_min) in MODES.items():
        be.ops.wide_sampler, be.ops.split_draw_min = wide, split_min
        for k in (int(x) for x in args.top_k.split(",")):
            if name == "split" and k > 32:
                continue  # the split draw takes top-k <= 32 only

            def draw(k=k):
                be.ops.sample(logits, args.vocab, k, 0.8, 0.7, 1, None, out, be.seen[0], 1.5,
                              be.draw_cand)  # fmt: skip

            run(f"{name} draw, top-k {k}, penalty 1.5", draw)
        run(f"{name}: sample_rows, the app's defaults, in place",
            lambda: be.sample_rows(logits, out, DEFAULTS, in_place=True))  # fmt: skip
    # The split draw's two kernels one at a time (the draw's block reads the candidates the
    # last draw_candidates left, as it does after it).
    be.ops.wide_sampler, be.ops.split_draw_min = True, 1 << 16
    seen, cand = be.seen[0], be.draw_cand
    run("split, top-k 20: draw_candidates alone",
        lambda: be.ops.draw_candidates(logits, args.vocab, 20, seen, 1.5, cand))  # fmt: skip
    real = be.ops.draw_candidates
    be.ops.draw_candidates = lambda *a: None
    try:
        run("split, top-k 20: the draw's block alone",
            lambda: be.ops.sample(logits, args.vocab, 20, 0.8, 0.7, 1, None, out, seen, 1.5,
                                  cand))  # fmt: skip
    finally:
        be.ops.draw_candidates = real
    meta = {"vocab": args.vocab, "dtype": args.dtype, "calls": args.calls, "reps": args.reps}
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "draw_bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()
