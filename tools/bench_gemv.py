"""Micro-benchmark of the decode GEMV for MLX affine 4-bit weights (CUDA backend, GPU only).

For every projection shape of the 4B model (batch 1, and a few at 4 and 8 activation rows),
checks each kernel variant against a float32 reference (dequantize, then matmul) and times it:
a CUDA graph of back-to-back launches, replayed, timed with CUDA events. Weights are rotated
through enough copies that the bytes streamed per replay exceed the L2 several times over;
shapes whose copies still fit in L2 are flagged. Bytes counted: codes + scales + biases + x + y.
Prints a table (old kernel = best of its variants, new = best tensor-core variant), an
estimate of the 4B decode step's projection time, and writes gemv_bench.json to --out.

    PYTHONPATH=. python3 tools/bench_gemv.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from engine.backends.cuda.launch import Kernels, l2_bytes, on_stream
from engine.backends.cuda.projection_tuning import best_replay_s
from engine.backends.cuda.projections import GEMV_SWIGLU_VARIANTS, GEMV_VARIANTS, Projections
from engine.backends.cuda.weights import QWeight
from engine.bf16 import from_bf16, to_bf16
from engine.testing.receipt import commit

# name, out, in, swiglu, activation rows, uses per 4B decode step (24 DeltaNet + 8 attention layers)
SHAPES = [
    ("in_proj_qkv", 8192, 2560, False, 1, 24),
    ("in_proj_z", 4096, 2560, False, 1, 24),
    ("in_proj_a/b", 32, 2560, False, 1, 48),
    ("out_proj", 2560, 4096, False, 1, 24),
    ("q_proj", 8192, 2560, False, 1, 8),
    ("k/v_proj", 1024, 2560, False, 1, 16),
    ("o_proj", 2560, 4096, False, 1, 8),
    ("gate/up swiglu", 9216, 2560, True, 1, 32),
    ("down", 2560, 9216, False, 1, 32),
    ("lm_head", 248320, 2560, False, 1, 1),
    ("in_proj_qkv M=4", 8192, 2560, False, 4, 0),
    ("gate/up swiglu M=4", 9216, 2560, True, 4, 0),
    ("down M=8", 2560, 9216, False, 8, 0),
]
STREAM_BYTES = 400e6  # bytes of distinct weight copies to rotate through


def to_act(ops: Projections, x):
    """float32 cupy array -> the activation storage type (bf16 as uint16 bits)."""
    import cupy

    if ops.dtype == "bfloat16":
        return to_bf16(x, cupy)
    return x.astype(ops.k.act_dtype)


def from_act(ops: Projections, a):
    import cupy

    if ops.dtype == "bfloat16":
        return from_bf16(a, cupy)
    return a.astype(cupy.float32)


def make_weight(
    ops: Projections, out: int, cols: int, seed: int, blocked: bool | None = None
) -> QWeight:
    """Random codes, scales and biases, in 8-row blocks where the loader would store them
    (blocked None) or as asked; the same seed gives the same values in either order."""
    import cupy

    from engine.backends.cuda.weights import blocked_copy

    rs = cupy.random.RandomState(seed)
    codes = (rs.random_sample((out, cols // 8)) * 2.0**32).astype(cupy.uint32)
    s = (0.004 + 0.01 * rs.random_sample((out, cols // 64))).astype(cupy.float32)
    b = (-8.0 * s + 0.002 * rs.standard_normal((out, cols // 64))).astype(cupy.float32)
    w = QWeight(codes, to_act(ops, s), to_act(ops, b), 4, 64, (out, cols))
    if blocked is None:
        blocked = ops.blocks_ok(4, 64, cols)
    return blocked_copy(ops, w) if blocked else w


def copy_weight(w: QWeight) -> QWeight:
    """A copy in new memory (blocks: with the rows up to the next multiple of 8)."""
    import cupy

    rows = -(-w.shape[0] // 8) * 8 if w.blocked else w.shape[0]
    parts = []
    for a in (w.packed, w.scales, w.biases):
        whole = cupy.ndarray((rows, a.shape[1]), a.dtype, memptr=a.data)
        parts.append(whole.copy()[: w.shape[0]])
    return QWeight(*parts, 4, 64, w.shape, blocked=w.blocked)


def reference(ops: Projections, x32, w: QWeight, up: QWeight | None):
    """float32 x @ dequant(w).T (silu(.) * x @ dequant(up).T for SwiGLU), in row chunks."""
    import cupy

    def one(q: QWeight):
        if q.blocked:  # the device's own dequantization reads the blocks (half-rounded weights)
            dense = cupy.empty(q.shape, ops.k.act_dtype)
            ops.dequant(q, dense)
            return x32 @ from_act(ops, dense).T
        out = cupy.empty((x32.shape[0], q.shape[0]), cupy.float32)
        shifts = cupy.arange(0, 32, 4, dtype=cupy.uint32)
        for r0 in range(0, q.shape[0], 16384):
            c = q.packed[r0 : r0 + 16384]
            n = c.shape[0]
            codes = ((c[:, :, None] >> shifts) & 15).astype(cupy.float32).reshape(n, -1, 64)
            s = from_act(ops, q.scales[r0 : r0 + n])[:, :, None]
            b = from_act(ops, q.biases[r0 : r0 + n])[:, :, None]
            wd = (codes * s + b).reshape(n, -1)
            out[:, r0 : r0 + n] = x32 @ wd.T
        return out

    y = one(w)
    if up is not None:
        y = y / (1.0 + cupy.exp(-y)) * one(up)
    return y


def time_variant(ops: Projections, choice, x, ws, out, ups) -> float:
    """Seconds per launch: a graph of back-to-back launches over the weight copies."""
    import cupy

    per = max(1, math.ceil(100 / len(ws)))
    stream = cupy.cuda.Stream(non_blocking=True)
    with on_stream(stream):
        for i in range(len(ws)):  # warm (compiles on first use)
            ops.gemv_run(choice, x, ws[i], out, ups[i] if ups else None)
        stream.synchronize()
        stream.begin_capture()
        for _ in range(per):
            for i in range(len(ws)):
                ops.gemv_run(choice, x, ws[i], out, ups[i] if ups else None)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        best = best_replay_s(graph, stream, 5)
    return best / (per * len(ws))


def kernel_regs(ops: Projections, choice, R: int, swiglu: bool) -> int:
    if choice[0] != "mma":
        return -1
    fn = ops.gemv4_kernel(R, swiglu, tuple(choice[1:]))
    return int(fn.num_regs)


def bench_shape(ops: Projections, spec, seed: int) -> dict:
    import cupy

    name, n_out, cols, swiglu, R, uses = spec
    w = make_weight(ops, n_out, cols, seed)
    up = make_weight(ops, n_out, cols, seed + 1000) if swiglu else None
    x32 = cupy.random.RandomState(seed + 7).standard_normal((R, cols)).astype(cupy.float32)
    x = to_act(ops, x32)
    x32 = from_act(ops, x)
    out = cupy.zeros((R, n_out), ops.k.act_dtype)
    ref = reference(ops, x32, w, up)
    wbytes = w.nbytes * (2 if swiglu else 1)
    nbytes = wbytes + x.nbytes + out.nbytes
    copies = int(min(64, max(1, math.ceil(STREAM_BYTES / wbytes))))

    def with_copies(a, b):
        more = [copy_weight(a) for _ in range(copies - 1)]
        return a, b, [a] + more, [b] + [copy_weight(b) for _ in more] if swiglu else None

    # gemv4 reads the blocks, the SIMT kernel MLX's row order: the same values in each
    orders = {"mma": with_copies(w, up)}
    if w.blocked:
        w_rows = make_weight(ops, n_out, cols, seed, blocked=False)
        up_rows = make_weight(ops, n_out, cols, seed + 1000, blocked=False) if swiglu else None
        orders["old"] = with_copies(w_rows, up_rows)
    else:
        orders["old"] = orders["mma"]
    rows = []
    old_variants = GEMV_SWIGLU_VARIANTS if swiglu else GEMV_VARIANTS
    new_variants = [c for c in ops.gemv_candidates(x, w, up) if c[0] == "mma"]
    for choice in new_variants + [("old", *v) for v in old_variants]:
        cw, cup, ws, ups = orders[choice[0]]
        out.fill(0)
        ops.gemv_run(choice, x, cw, out, cup)
        y = from_act(ops, out)
        err = float(cupy.abs(y - ref).max() / max(float(cupy.abs(ref).max()), 1e-6))
        t = time_variant(ops, choice, x, ws, out, ups)
        rows.append(
            dict(
                variant=list(choice),
                us=t * 1e6,
                gb_s=nbytes / t / 1e9,
                rel_err=err,
                ok=err <= 1e-2,
                regs=kernel_regs(ops, choice, R, swiglu),
            )
        )
    tuned = ops.choose(("bench", R, n_out, cols, swiglu), x, w, out, up)
    del orders, ws, ups
    cupy.get_default_memory_pool().free_all_blocks()
    old = min((r for r in rows if r["variant"][0] == "old"), key=lambda r: r["us"])
    new = [r for r in rows if r["variant"][0] == "mma"]
    new_best = min(new, key=lambda r: r["us"]) if new else old
    return dict(
        shape=name,
        out=n_out,
        cols=cols,
        rows=R,
        swiglu=swiglu,
        uses_per_step=uses,
        bytes=nbytes,
        copies=copies,
        l2_resident=copies * wbytes < 2 * l2_bytes(),
        old=old,
        new=new_best,
        tuned=next(r for r in rows if r["variant"] == list(tuned)),
        variants=rows,
    )


def half_check() -> dict:
    """fp16 activations through the tensor-core kernel (correctness only)."""
    import cupy

    ops = Projections(Kernels("float16"))
    res = {}
    cases = [(4096, 2560, 1, False), (1000, 9216, 3, False), (520, 2560, 2, True)]
    for n_out, cols, R, sw in cases:
        w = make_weight(ops, n_out, cols, 11)
        up = make_weight(ops, n_out, cols, 12) if sw else None
        x32 = cupy.random.RandomState(3).standard_normal((R, cols)).astype(cupy.float32)
        x = x32.astype(cupy.float16)
        ref = reference(ops, x.astype(cupy.float32), w, up)
        out = cupy.zeros((R, n_out), cupy.float16)
        cands = [c for c in ops.gemv_candidates(x, w, up) if c[0] == "mma"]
        for cand in (cands[0], cands[-1]):
            out = cupy.zeros((R, n_out), cupy.float16)
            ops.gemv_run(cand, x, w, out, up)
            y = out.astype(cupy.float32)
            err = float(cupy.abs(y - ref).max() / float(cupy.abs(ref).max()))
            res[f"{n_out}x{cols} M={R} swiglu={sw} {cand}"] = err
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--only", default="", help="comma-separated shape names (default all)")
    args = ap.parse_args()
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    meta = {
        "gpu": props["name"].decode(),
        "l2_bytes": props["l2CacheSize"],
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
    }
    ops = Projections(Kernels("bfloat16"))
    only = {s for s in args.only.split(",") if s}
    results = []
    for i, spec in enumerate(SHAPES):
        if only and spec[0] not in only:
            continue
        r = bench_shape(ops, spec, seed=i)
        print(json.dumps({k: v for k, v in r.items() if k != "variants"}), flush=True)
        for v in r["variants"]:
            print(f"    {v}", flush=True)
        results.append(r)
    half = half_check()
    print("fp16 rel errors:", json.dumps(half), flush=True)
    report = {"meta": meta, "results": results, "fp16_rel_err": half}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemv_bench.json").write_text(json.dumps(report, indent=1))
    print(table(results, meta))


def table(results: list[dict], meta: dict) -> str:
    lines = [
        f"GPU {meta['gpu']}, commit {meta['commit']}, {meta['date']}; bf16 activations.",
        "",
        "| shape | out x in | M | old µs | old GB/s | new µs | new GB/s | new variant | "
        "tuner's pick GB/s | rel err |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    t_old = t_new = t_tuned = 0.0
    step_bytes = 0
    for r in results:
        o, n = r["old"], r["new"]
        flag = " (L2)" if r["l2_resident"] else ""
        err = max(v["rel_err"] for v in r["variants"])
        lines.append(
            f"| {r['shape']}{flag} | {r['out']}x{r['cols']} | {r['rows']} | {o['us']:.2f} | "
            f"{o['gb_s']:.0f} | {n['us']:.2f} | {n['gb_s']:.0f} | {tuple(n['variant'][1:])} | "
            f"{r['tuned']['gb_s']:.0f} | {err:.1e} |"
        )
        t_old += r["uses_per_step"] * o["us"]
        t_new += r["uses_per_step"] * n["us"]
        t_tuned += r["uses_per_step"] * r["tuned"]["us"]
        step_bytes += r["uses_per_step"] * r["bytes"]
    if t_new:
        lines += [
            "",
            f"4B decode step, projections (sum over uses): old {t_old / 1e3:.3f} ms "
            f"({step_bytes / t_old / 1e3:.0f} GB/s), new {t_new / 1e3:.3f} ms "
            f"({step_bytes / t_new / 1e3:.0f} GB/s); with the tuner's picks "
            f"{t_tuned / 1e3:.3f} ms ({step_bytes / t_tuned / 1e3:.0f} GB/s).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
