"""What one dependent hand-off between all the blocks of the GPU costs (GPU only): a kernel
boundary under programmatic dependent launch, as the decode step has between its launches,
against a flag inside one persistent kernel, as a whole-step kernel would have.

Each of `--stages` stages is what a projection's chain does without its weights: every block
stages the whole vector the previous stage wrote (n floats, from L2) in shared memory, with
16-byte loads all requested before any is used (as gemv4 stages its input), sums its
squares, and writes its own slice of the next vector (x * rsqrt(mean(x^2) + eps), plus its
index). Run four ways, each timed over replays of a CUDA graph:

    pdl         one launch a stage, captured with programmatic dependent launch (the engine's
                decode graph: griddepcontrol.wait before the reads, launch_dependents after)
    bulk        as pdl, but thread 0 copies the vector into shared memory with one bulk copy
                (cp.async.bulk, the copy engine) instead of every thread loading its part
    plain       one launch a stage, captured without it
    persistent  one launch in all; stage s waits until every block has counted itself in
                for stage s - 1 (a counter each stage: fence, atomic add; thread 0 polls)
    pdl-smem    as pdl, with the words below (only where there are some) brought into shared
                memory by one bulk copy a block before the wait, not into registers: whether
                the staging's loads still wait behind words that take the copy engine's path
    ahead A     as persistent, with each stage's words (only where there are some) brought
                into a ring of shared memory by one bulk copy a block, requested A stages
                before the stage that uses them (`--ahead`, comma-separated): whether a
                whole-step kernel that streams the weights of the stages ahead hands off at
                the bare counter's cost while those bytes are in flight

`--copies N` (pdl only) cycles the stages through N instances of the stage kernel, each its
own machine code, as the decode step runs a different kernel at each boundary: with enough
copies none of a stage's code is in the SM's instruction caches when it starts. `--code K`
adds K rounds of unrolled integer work after each stage's staging (about 40 bytes of code a
round, executed once by every warp), standing for the code a projection runs after its
staging. Hot against cold code at the same K is what instruction fetch costs a boundary.

`--weights K` (every way but plain) has every thread request K 16-byte words from device
memory before the wait (persistent: before its wait for the counter) and use them after the
stage, as a projection requests its first weights: it shows how much a stage's reads wait
behind them.

It prints microseconds a stage for each, and for pdl, bulk and persistent the staging span
(thread 0's clock from the wait to the vector in shared memory), and writes
bench_handoff.json.
These are kernel-level figures for deciding where the decode step can save time, not the
product's speed.

    PYTHONPATH=. python3 tools/bench_handoff.py --blocks 64,132 --weights 0,8 --out OUT
    PYTHONPATH=. python3 tools/bench_handoff.py --blocks 132 --n 1024 --weights 0,4,8 \
        --ahead 0,1,2,4 --out OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

SOURCE = r"""
__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += red[w];
  return t;
}

// x into shared memory xs by every thread's 16-byte loads, up to VMAX a thread requested
// before any is stored (one round trip to L2 up to 16 floats a thread), as a projection
// stages its input.
constexpr int VMAX = 4;
__device__ __forceinline__ void load_x(const float* x, float* xs, int n) {
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* s4 = reinterpret_cast<float4*>(xs);
  const int n4 = n >> 2, bd = blockDim.x;
  for (int i0 = threadIdx.x; i0 < n4; i0 += VMAX * bd) {
    float4 v[VMAX];
#pragma unroll
    for (int k = 0; k < VMAX; ++k)
      if (i0 + k * bd < n4) v[k] = __ldcg(x4 + i0 + k * bd);
#pragma unroll
    for (int k = 0; k < VMAX; ++k)
      if (i0 + k * bd < n4) s4[i0 + k * bd] = v[k];
  }
}

// The rest of a stage, x in xs (after a barrier): this block's slice of y.
__device__ __forceinline__ void finish(const float* xs, float* y, int n) {
  __shared__ float red[32];
  float s = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(xs[i], xs[i], s);
  const float inv = rsqrtf(block_sum(s, red) / n + 1e-6f);
  const int per = (n + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per;
  for (int i = lo + threadIdx.x; i < min(n, lo + per); i += blockDim.x)
    y[i] = xs[i] * inv + 1e-3f * (i & 7);
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

constexpr int WMAX = 16;

#if __CUDA_ARCH__ >= 900
// One bulk copy (the copy engine) of `bytes` from global src into shared dst, completing on
// the mbarrier at shared address bar (thread 0 issues it); mbar_wait: every thread waits for
// the barrier's phase of that parity to complete.
__device__ __forceinline__ void bulk_to_shared(void* dst, const void* src, unsigned bytes,
                                               unsigned bar) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(d), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity = 0) {
  unsigned done = 0;
  do {
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
#endif

// K rounds of integer mixing in 8 independent chains, fully unrolled: about 40 bytes of
// machine code a round that every warp executes once, standing for the code a projection
// runs after its staging (the norm, the first tile's products).
template <int K>
__device__ __forceinline__ unsigned mix(unsigned h) {
  unsigned a[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) a[c] = h + c;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const unsigned v = a[k & 7];
    a[k & 7] = (v ^ (v >> 7)) * 0x9E3779B1u + 2654435761u * k;
  }
  unsigned r = 0;
#pragma unroll
  for (int c = 0; c < 8; ++c) r ^= a[c];
  return r;
}

// C: which copy (each instance is its own machine code, so copies cycled stage by stage find
// none of it in the SM's instruction caches when there are enough of them); K: mix's rounds
// after the staging.
// w: this stage's words, WMAX at most a thread, requested before the wait and used after the
// stage (their xor goes to sink only in the impossible case, so the loads stay). span[block]:
// nanoseconds from the wait's return to x in shared memory, as thread 0 saw them.
template <int C, int K>
__global__ void handoff_stage(const float* x, float* y, int n, int pdl, const uint4* w,
                              int wper, int bulk, int wsm, unsigned* sink,
                              unsigned long long* span) {
  extern __shared__ float xs[];
  __shared__ __align__(8) unsigned long long bar, wbar;
  uint4 wv[WMAX];
  const uint4* wb = w + (long)blockIdx.x * wper * blockDim.x + threadIdx.x;
  // wsm: the block's words go to shared memory after xs by one bulk copy (the copy engine),
  // not into registers through the load path the staging uses.
  uint4* const ws = reinterpret_cast<uint4*>(xs + ((n + 3) & ~3));
  if (!wsm) {
#pragma unroll
    for (int j = 0; j < WMAX; ++j)
      if (j < wper) wv[j] = __ldcs(wb + (long)j * blockDim.x);
  }
#if __CUDA_ARCH__ >= 900
  const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
  const unsigned wbs = static_cast<unsigned>(__cvta_generic_to_shared(&wbar));
  if (bulk || wsm) {
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(wbs) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
  if (wsm && threadIdx.x == 0)
    bulk_to_shared(ws, w + (long)blockIdx.x * wper * blockDim.x, wper * blockDim.x * 16, wbs);
  if (pdl) asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#endif
  const unsigned long long t0 = now_ns();
#if __CUDA_ARCH__ >= 900
  if (bulk) {
    if (threadIdx.x == 0) bulk_to_shared(xs, x, n * 4, b);
    mbar_wait(b);
  }
#endif
  if (!bulk) load_x(x, xs, n);
  __syncthreads();
  if (threadIdx.x == 0) span[blockIdx.x] = now_ns() - t0;
  const unsigned h = mix<K>(threadIdx.x + C);
  finish(xs, y, n);
  unsigned acc = K > 0 && h == 0x2545F491u ? 1u : 0u;
#if __CUDA_ARCH__ >= 900
  if (wsm) {
    mbar_wait(wbs);
#pragma unroll
    for (int j = 0; j < WMAX; ++j)
      if (j < wper) wv[j] = ws[j * blockDim.x + threadIdx.x];
  }
#endif
#pragma unroll
  for (int j = 0; j < WMAX; ++j)
    if (j < wper) acc ^= wv[j].x ^ wv[j].y ^ wv[j].z ^ wv[j].w;
  if (acc == 0x9e3779b9u && (wper > 0 || K > 0)) sink[0] = acc;
}

// The persistent ways' hand-off: thread 0 waits until every block has counted itself in for
// stage s - 1 (none before stage 0); count_in, after the block's last barrier of stage s,
// counts it in for s (its writes fenced first).
__device__ __forceinline__ void wait_count(const unsigned* count, int s) {
  if (s == 0) return;
  unsigned seen = 0;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                 : "=r"(seen) : "l"(count + s - 1) : "memory");
  } while (seen < gridDim.x);
}
__device__ __forceinline__ void count_in(unsigned* count, int s) {
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(count + s, 1u);
  }
}

// Stage s of the persistent ways once its wait is over: the vector (buf's half s & 1) into
// xs, thread 0's staging span recorded, this block's slice of the next vector written.
__device__ __forceinline__ void persistent_stage(float* buf, float* xs, int n, int s,
                                                 unsigned long long* span) {
  const unsigned long long t0 = now_ns();
  load_x(buf + (s & 1) * n, xs, n);
  __syncthreads();
  if (threadIdx.x == 0) span[(long)s * gridDim.x + blockIdx.x] = now_ns() - t0;
  finish(xs, buf + ((s + 1) & 1) * n, n);
}

// All stages in one launch (every block resident: the caller keeps the grid at the SMs).
// count[s] counts the blocks done with stage s; stage s + 1 starts when it reaches the grid.
// w, wper, span: as handoff_stage's, stage s's words at w + s * (grid * wper * threads),
// each requested before the stage's wait for the counter.
extern "C" __global__ void handoff_persistent(float* buf, unsigned* count, int n, int stages,
                                              const uint4* w, int wper, unsigned* sink,
                                              unsigned long long* span) {
  extern __shared__ float xs[];
  unsigned acc = 0;
  for (int s = 0; s < stages; ++s) {
    uint4 wv[WMAX];
    const uint4* wb = w + ((long)s * gridDim.x + blockIdx.x) * wper * blockDim.x + threadIdx.x;
#pragma unroll
    for (int j = 0; j < WMAX; ++j)
      if (j < wper) wv[j] = __ldcs(wb + (long)j * blockDim.x);
    if (s > 0) {
      if (threadIdx.x == 0) wait_count(count, s);
      __syncthreads();
    }
    persistent_stage(buf, xs, n, s, span);
#pragma unroll
    for (int j = 0; j < WMAX; ++j)
      if (j < wper) acc ^= wv[j].x ^ wv[j].y ^ wv[j].z ^ wv[j].w;
    __syncthreads();  // xs is restaged next stage
    count_in(count, s);
  }
  if (acc == 0x9e3779b9u && wper > 0) sink[0] = acc;
}

// As handoff_persistent, but each stage's words come into a ring of ahead + 1 slots of
// shared memory by one bulk copy a block (the copy engine), thread 0 issuing stage
// s + ahead's copy at stage s before its wait for the counter: the words a stage uses were
// requested `ahead` stages earlier, as a whole-step kernel would stream the weights of the
// stages ahead while the chain of hand-offs runs. ahead 0: requested at the stage itself.
// Slot s % (ahead + 1) last held stage s - 1's words, read before that stage's last barrier.
constexpr int AMAX = 7;
extern "C" __global__ void handoff_ahead(float* buf, unsigned* count, int n, int stages,
                                         const uint4* w, int wper, int ahead, unsigned* sink,
                                         unsigned long long* span) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ float xs[];
  __shared__ __align__(8) unsigned long long bars[AMAX + 1];
  const int slots = ahead + 1;
  const unsigned per = wper * blockDim.x;  // 16-byte words a block's slot holds
  uint4* const ring = reinterpret_cast<uint4*>(xs + ((n + 3) & ~3));
  const unsigned bar0 = static_cast<unsigned>(__cvta_generic_to_shared(bars));
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * i) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < min(ahead, stages); ++s)
      bulk_to_shared(ring + (s % slots) * per, w + ((long)s * gridDim.x + blockIdx.x) * per,
                     per * 16, bar0 + 8 * (s % slots));
  }
  __syncthreads();
  unsigned acc = 0;
  for (int s = 0; s < stages; ++s) {
    const int slot = s % slots;
    if (threadIdx.x == 0) {
      const int a = s + ahead;
      if (a < stages)
        bulk_to_shared(ring + (a % slots) * per, w + ((long)a * gridDim.x + blockIdx.x) * per,
                       per * 16, bar0 + 8 * (a % slots));
      wait_count(count, s);
    }
    __syncthreads();
    persistent_stage(buf, xs, n, s, span);
    mbar_wait(bar0 + 8 * slot, (s / slots) & 1);
    for (int j = 0; j < wper; ++j) {
      const uint4 v = ring[slot * per + j * blockDim.x + threadIdx.x];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    __syncthreads();  // xs is restaged and this slot refilled next stage
    count_in(count, s);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
#endif
}
"""

WAYS = ("pdl", "bulk", "plain", "persistent", "pdl-smem")
WMAX = 16  # the kernel's most words a thread
AMAX = 7  # handoff_ahead's most stages ahead (its ring's mbarriers)


def reference(x: np.ndarray, stages: int) -> np.ndarray:
    """The stages on the host (float64 sums; the device's differ by rounding)."""
    idx = 1e-3 * (np.arange(x.size) & 7)
    for _ in range(stages):
        inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean() + 1e-6)
        x = (x * inv + idx).astype(np.float32)
    return x


def run(
    blocks: int,
    n: int,
    stages: int,
    replays: int,
    threads: int,
    weights: int,
    copies: int = 1,
    code: int = 0,
    ahead: tuple = (),
) -> dict:
    """Microseconds a stage for each way at this grid with `weights` words a thread in flight
    at each wait (plain only without; pdl alone where `copies` > 1 or `code` > 0: the
    module-level docstring), each way's largest relative difference from
    `reference`, and the mean staging span (thread 0's wait to the vector in shared memory,
    over the last replay's blocks and stages)."""
    import cupy

    from engine.backends.cuda.launch import (
        launch_pdl,
        on_stream,
        pdl_available,
        sm_count,
        smem_per_block,
    )

    names = [f"handoff_stage<{c},{code}>" for c in range(copies)]
    mod = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=names)
    stage_fns = [mod.get_function(name) for name in names]
    persist = mod.get_function("handoff_persistent")
    persist_ahead = mod.get_function("handoff_ahead")
    x0 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    want = reference(x0, stages)
    buf = cupy.empty(2 * n, cupy.float32)
    count = cupy.zeros(stages, cupy.uint32)
    sink = cupy.zeros(1, cupy.uint32)
    spans = cupy.zeros((stages, blocks), cupy.uint64)
    # A fresh slice of words for every stage: more than L2 holds over the chain, so the
    # words come from device memory as a projection's weights do.
    per_stage = blocks * threads * weights * 4
    words = cupy.arange(max(1, stages * per_stage), dtype=cupy.uint32)
    stream = cupy.cuda.Stream(non_blocking=True)
    n32, s32 = np.int32(n), np.int32(stages)
    xs_bytes = 4 * ((n + 3) & ~3)  # the staged vector, 16-byte aligned (the ring after it)

    def chain(pdl: bool, bulk: bool, wsm: bool = False):
        smem = xs_bytes + (16 * weights * threads if wsm else 0)
        if smem > 48 * 1024:
            for fn in stage_fns:
                fn.max_dynamic_shared_size_bytes = smem
        for s in range(stages):
            x, y = buf[(s & 1) * n :][:n], buf[((s + 1) & 1) * n :][:n]
            w = words[s * per_stage :] if weights else words
            flags = (np.int32(pdl), w, np.int32(weights), np.int32(bulk), np.int32(wsm))
            args = (x, y, n32, *flags, sink, spans[s])
            launch_pdl(stage_fns[s % copies], (blocks,), (threads,), args, smem, pdl=pdl)

    def persistent(_pdl: bool, _bulk: bool):
        count.fill(0)
        args = (buf, count, n32, s32, words, np.int32(weights), sink, spans)
        persist((blocks,), (threads,), args, shared_mem=4 * n)

    def streamed(a: int):
        smem = xs_bytes + (a + 1) * 16 * weights * threads
        persist_ahead.max_dynamic_shared_size_bytes = smem
        count.fill(0)
        args = (buf, count, n32, s32, words, np.int32(weights), np.int32(a), sink, spans)
        persist_ahead((blocks,), (threads,), args, shared_mem=smem)

    out = {}

    def chain_smem(_pdl: bool, _bulk: bool):
        chain(True, False, True)

    bodies = {
        "pdl": chain,
        "bulk": chain,
        "plain": chain,
        "persistent": persistent,
        "pdl-smem": chain_smem,
    }
    room = smem_per_block() - xs_bytes
    for a in ahead:
        if weights and blocks <= sm_count() and (a + 1) * 16 * weights * threads <= room:
            bodies[f"ahead {a}"] = lambda _p, _b, a=a: streamed(a)
    for name in bodies:
        if name in ("pdl", "bulk", "pdl-smem") and not pdl_available():
            continue
        if name == "pdl-smem" and not weights:
            continue
        if (copies > 1 or code) and name != "pdl":
            continue
        if name == "persistent" and blocks > sm_count():  # needs every block resident at once
            continue
        if weights and name == "plain":
            continue
        with on_stream(stream):
            stream.begin_capture()
            bodies[name](name in ("pdl", "bulk"), name == "bulk")
            graph = stream.end_capture()
            times = []
            for _ in range(replays):
                buf[:n] = cupy.asarray(x0)
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                e0.record(stream)
                graph.launch(stream)
                e1.record(stream)
                e1.synchronize()
                times.append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3)
        got = cupy.asnumpy(buf[(stages & 1) * n :][:n])
        err = float(np.abs(got - want).max() / np.abs(want).max())
        out[name] = {"us_per_stage": float(np.median(times)) / stages, "rel_err": err}
        out[name]["staging_us"] = float(spans.astype(cupy.float64).mean()) / 1e3
    return out


STAGING = ("pdl", "bulk", "persistent", "pdl-smem")  # the ways whose staging span is shown


def table(results: dict, stages: int, n: int, threads: int = 256, code: int = 0) -> str:
    """The markdown table of `results` ({(blocks, weights, copies): {way: {us_per_stage,
    ...}}}); `code`: the rounds of work after each staging (--code)."""
    streamed = sorted({w for r in results.values() for w in r if w.startswith("ahead")})
    ways, staging = (*WAYS, *streamed), (*STAGING, *streamed)
    lines = [
        f"{stages} stages of {n} floats, {threads} threads a block, {code} rounds of work "
        "after each staging; microseconds a stage (median of the replays); words: 16-byte "
        "loads a thread in flight at each wait; copies: stage kernels cycled (each its own "
        "code); staging: mean microseconds from the wait to the vector in shared memory",
        "",
        "| blocks | words | copies | "
        + " | ".join(ways)
        + " | "
        + " | ".join(f"staging, {w}" for w in staging)
        + " |",
        "|---" * (len(ways) + len(staging) + 3) + "|",
    ]
    for (blocks, weights, copies), by_way in sorted(results.items()):
        cells = [f"{by_way[w]['us_per_stage']:.2f}" if w in by_way else "-" for w in ways]
        cells += [
            f"{by_way[w]['staging_us']:.2f}" if "staging_us" in by_way.get(w, {}) else "-"
            for w in staging
        ]
        lines.append(f"| {blocks} | {weights} | {copies} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--blocks", default="64,132", help="grid sizes (persistent: at most the SM count)"
    )
    ap.add_argument("--n", type=int, default=2560, help="floats in the vector")
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument(
        "--weights",
        default="0",
        help=f"16-byte words a thread requests before each wait (<= {WMAX})",
    )
    ap.add_argument("--copies", default="1", help="stage kernels cycled (comma-separated)")
    ap.add_argument("--code", type=int, default=0, help="rounds of work after each staging")
    ap.add_argument(
        "--ahead",
        default="",
        help="stages ahead the `ahead` way requests each stage's words (comma-separated, "
        f"0 to {AMAX}; only with words)",
    )
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    if args.n % 4 or 4 * args.n > 48 * 1024:
        raise SystemExit(f"--n {args.n}: a multiple of 4 up to 12288 (shared memory)")
    ahead = tuple(int(a) for a in args.ahead.split(",") if a)
    if any(not 0 <= a <= AMAX for a in ahead):
        raise SystemExit(f"--ahead {args.ahead}: each between 0 and {AMAX}")
    results = {}
    for blocks in (int(b) for b in args.blocks.split(",")):
        for weights in (int(w) for w in args.weights.split(",")):
            if not 0 <= weights <= WMAX:
                raise SystemExit(f"--weights {weights}: between 0 and {WMAX}")
            for copies in (int(c) for c in args.copies.split(",")):
                shape = (args.n, args.stages, args.replays, args.threads, weights)
                got = run(blocks, *shape, copies, args.code, ahead)
                results[(blocks, weights, copies)] = got
                for way, r in got.items():
                    if r["rel_err"] > 1e-3:
                        err = r["rel_err"]
                        raise SystemExit(
                            f"{way}, {blocks} blocks, {weights} words, {copies} copies: "
                            f"error {err:.1e}"
                        )
    text = table(results, args.stages, args.n, args.threads, args.code)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {"blocks": b, "weights": w, "copies": c, "code": args.code, "way": way, **r}
        for (b, w, c), by_way in sorted(results.items())
        for way, r in by_way.items()
    ]
    (out / "bench_handoff.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
