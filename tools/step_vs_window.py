"""Where does a decode step stop agreeing with a window? (CUDA backend, GPU only.)

Builds a random checkpoint at a real Qwen3.5 shape, runs a 64-token window on slot 0 and then
one decode step, and a 65-token window (the same tokens plus the step's) on slot 1. Every
call the model makes into the backend (input norm + projections, the mixer, norm + MLP) is
recorded for the last row, and the first call whose output differs by more than --tol
(relative to its largest value) is printed with the ones before it. With --pretune, one
step runs on slot 1 first, so the step's kernels are compiled and tuned before the compared
step (as `Engine.load` does at warm-up). With --check-products, every projection of the
compared step is recomputed with CuPy (cuBLAS) from its own input right after it runs, and
each one that disagrees is printed with the kernel variant that ran it (dense weights only:
a bf16 checkpoint).

    PYTHONPATH=. python3 tools/step_vs_window.py --shape 4B --dtype float32 [--pretune]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from engine.backends.base import Batch
from engine.backends.cuda.backend import CudaBackend
from engine.backends.cuda.synth import write_checkpoint
from engine.checkpoint.checkpoint import Checkpoint
from engine.models.qwen35 import Qwen35Model

RECORDED = ("norm_linear_many", "gated_delta_out", "attention", "norm_mlp")


def record(be, log: list) -> None:
    """Wrap the backend calls the model makes; nested calls (a fallback calling another
    recorded method) are not recorded twice."""
    depth = [0]

    def wrap(name):
        inner = getattr(be, name)

        def call(*args, **kw):
            depth[0] += 1
            try:
                out = inner(*args, **kw)
            finally:
                depth[0] -= 1
            if not depth[0]:
                first = out[0] if isinstance(out, tuple) else out
                parts = first if isinstance(first, list) else [first]
                for i, part in enumerate(parts):
                    log.append((f"{name}[{i}]", be.to_host(part)[-1].copy()))
            return out

        setattr(be, name, call)

    for name in RECORDED:
        wrap(name)


def check_products(be, log: list) -> None:
    """Wrap `Ops.gemv`: after each call, recompute its product with cuBLAS in fp32 and log
    (shape key, variant, tuned in this call, relative difference)."""
    import cupy

    ops = be.ops
    inner = ops.gemv

    def gemv(x, w, out, up=None, pro=None):
        key = ops.gemv_key(x, w, up, pro)
        fresh = key not in ops.gemv_choice
        inner(x, w, out, up=up, pro=pro)
        if pro is not None or not hasattr(w, "data"):
            return
        xf = x.astype(cupy.float32)
        ref = xf @ w.data.astype(cupy.float32).T
        if up is not None:
            u = xf @ up.data.astype(cupy.float32).T
            ref = ref / (1 + cupy.exp(-ref)) * u
        got = out.astype(cupy.float32)
        rel = float(cupy.abs(got - ref).max() / max(float(cupy.abs(ref).max()), 1e-30))
        log.append((key, ops.gemv_choice[key], fresh, rel))

    ops.gemv = gemv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4B")
    ap.add_argument("--format", default="bf16", choices=("bf16", "mlx4"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--pretune", action="store_true")
    ap.add_argument("--check-products", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--workdir", default="/tmp/snug-step-vs-window")
    args = ap.parse_args()
    path = write_checkpoint(Path(args.workdir) / args.shape, args.shape, args.format, seed=4)
    ids = np.random.default_rng(4).integers(0, 1000, 64)
    ck = Checkpoint.open(path)
    be = CudaBackend(dtype=args.dtype)
    model = Qwen35Model(ck.config, be, be.load_weights(ck, ck.config))
    be.alloc_state(ck.config, 2, 256)
    log: list = []
    record(be, log)
    if args.pretune:
        model.forward(Batch.step([(1, 0)]), np.array([3]))
        be.reset_slot(1)
    model.forward(Batch.window(0, 0, 64), ids)
    log.clear()
    products: list = []
    if args.check_products:
        check_products(be, products)
    model.forward(Batch.step([(0, 64)]), np.array([7]))
    be.ops.__dict__.pop("gemv", None)
    for i, (key, choice, fresh, rel) in enumerate(products):
        if rel > args.tol or fresh:
            flag = "WRONG" if rel > args.tol else "ok"
            print(f"product {i:4d} {flag:5s} {key} {choice} tuned_here={fresh} rel={rel:.3e}")
    if products:
        bad = sum(rel > args.tol for *_, rel in products)
        print(f"{bad} of {len(products)} step products disagree with cuBLAS")
    step = list(log)
    log.clear()
    model.forward(Batch.window(1, 0, 65), np.array([*ids.tolist(), 7]))
    window = list(log)
    for i, ((name, a), (_, b)) in enumerate(zip(step, window, strict=True)):
        rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
        print(f"{i:4d} {name:22s} {rel:.3e}")
        if rel > args.tol:
            print(f"first disagreement: call {i} ({name}), relative difference {rel:.3e}")
            return
    print(f"step and window agree within {args.tol:g} at all {len(step)} recorded calls")


if __name__ == "__main__":
    main()
