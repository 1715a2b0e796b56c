"""Can one thread-block cluster run a small model's layer chain faster than the whole GPU in
separate launches (GPU only, compute capability 9.0)? A premise measurement for a decode
path of the 0.8B, kernel-level, not the product's speed.

The decode step of the 0.8B is bound by its chain of dependent launches: each hand-off
between all the blocks of the GPU goes through L2 and costs 2 to 5 us (tools/bench_handoff.py,
docs/benchmarks.md), where the layer's weights (about 11 MB) would stream in about 3 us. In
one cluster of C SMs (8, or 16 where the GPU allows it), a hand-off is a cluster barrier and
the outputs go to every block's shared memory by distributed shared-memory stores, with no
round trip to L2; but C SMs read the weights at a fraction of the GPU's bandwidth. The other
SMs can bring the weights of the layers ahead toward L2 meanwhile (bulk prefetches, paced by
a progress counter the cluster writes), so that the cluster reads them from L2.

The chain is the 0.8B DeltaNet layer's four projections (MLX 4-bit, group 64, in gemv4's
8-row blocks, random weights): input group 8224x1024 and gate/up 2x3584x1024 with an RMS norm
of their input, out_proj 1024x2048 (on the first 2048 outputs of the input group, where the
DeltaNet step would be), down 1024x3584. Each warp computes 16-row tiles with gemv4's own
tensor-core pieces (gemv4_parts.cuh: fetch, compute), its first weights requested before the
cluster barrier. The DeltaNet step, the attention and the residual adds are not modelled.

Modes, each timed as one launch over `--layers` layers (us a layer, median of the replays):

    resident   one layer's weights read by every layer (they stay in L2): the upper bound
    hbm        a distinct layer each, no prefetching blocks: the cluster alone reads memory
    l2:D       a distinct layer each, the other clusters prefetch layer l once the cluster
               has begun layer l - D
    exchange   no weights read and no products: each stage's staging, sums, distributed
               shared-memory stores and cluster barrier alone (what a hand-off costs)

It also checks the resident chain's last vector against numpy (float64 from the same
weights), and prints block 0's mean microseconds a stage.

    PYTHONPATH=. python3 tools/bench_cluster_chain.py --clusters 8,16 --modes resident,hbm,l2:1,l2:2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

# (out rows, in columns, SwiGLU, RMS norm of the input) of the 0.8B DeltaNet layer.
STAGES = ((8224, 1024, 0, 1), (1024, 2048, 0, 0), (3584, 1024, 1, 1), (1024, 3584, 0, 0))
XMAX = 8256  # floats a vector buffer holds (the input group's 8224 outputs, rounded up)

SOURCE = r"""
struct StageDesc {
  int out, in, swiglu, norm, ks, pad;
  long long w0, w1, s0, s1;  // words of the codes, entries of the scales (biases follow)
};

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// v to the float at local shared address `local` in block `rank` of the cluster.
__device__ __forceinline__ void store_remote(const float* local, unsigned rank, float v) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(local)), r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(r), "f"(v) : "memory");
}
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Cluster 0 runs the chain; blocks of the other clusters prefetch (ahead >= 0) or exit.
// SB holds each matrix's scales, then its biases (s0 + sb_half).
template <int C, int NW, int UG>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(NW * 32, 1)
cluster_chain(const unsigned* __restrict__ W, const act_t* __restrict__ SB,
              const StageDesc* __restrict__ sd, int nst, int layers, long long layer_words,
              long long layer_sb, long long sb_half, int resident, int ahead, int work,
              const float* __restrict__ x0, float* __restrict__ out,
              volatile unsigned* progress, unsigned long long* __restrict__ stamps) {
  constexpr int NT = NW * 32;
  extern __shared__ float smem[];
  float* xbuf = smem;                                          // [2][XMAX]
  uint4* xs = reinterpret_cast<uint4*>(xbuf + 2 * XMAX);       // in/8 entries
  float* sx = reinterpret_cast<float*>(xs + XMAX / 8);         // 8 a group
  float* red = sx + XMAX / 8;                                  // 4 a thread
  __shared__ float rsum[32];
  const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5, g = lane >> 2, tig = lane & 3;

  if (blockIdx.x >= C) {  // a prefetching block
    if (ahead < 0) return;
    const int part = blockIdx.x - C, parts = gridDim.x - C;
    for (int l = 0; l < layers; ++l) {
      // Cluster 0 is scheduled first; should it not be, give up after 20 ms (flagged) rather
      // than wait for ever.
      if (tid == 0) {
        const unsigned long long t0 = now_ns();
        while (static_cast<int>(*progress) + ahead < l && !progress[1]) {
          __nanosleep(200);
          if (now_ns() - t0 > 20000000ull) progress[1] = 1;
        }
      }
      __syncthreads();
      if (progress[1]) return;
      const unsigned char* w = reinterpret_cast<const unsigned char*>(W + l * layer_words);
      const unsigned char* sb = reinterpret_cast<const unsigned char*>(SB + l * layer_sb);
      prefetch_share(w, layer_words * 4, part, parts);
      prefetch_share(sb, layer_sb * 2, part, parts);
    }
    return;
  }
  const unsigned rank = cluster_rank();
  for (int i = tid; i < XMAX / 8; i += NT) sx[i] = 0.f;  // rows 1..7 of each group stay zero
  for (int i = tid; i < STAGE0_IN; i += NT) xbuf[i] = x0[i];
  __syncthreads();
  int par = 0;
  for (int l = 0; l < layers; ++l) {
    if (rank == 0 && tid == 0) *progress = l;
    const unsigned* Wl = W + (resident ? 0 : l * layer_words);
    const act_t* SBl = SB + (resident ? 0 : l * layer_sb);
    for (int s = 0; s < nst; ++s) {
      const StageDesc d = sd[s];
      const int ROWS = d.swiglu ? 8 : 16, T = (d.out + ROWS - 1) / ROWS;
      const int ng = d.in >> 6, nw = d.in >> 3;
      const int nb = (d.out + 7) >> 3, KS = d.ks, slots = NW / KS, slot = wid / KS, ks = wid % KS;
      const int per = C * slots, rounds = (T + per - 1) / per;
      const int slice = (ng + KS - 1) / KS, ga = min(ng, ks * slice), gb = min(ng, ga + slice);
      const unsigned* W0 = Wl + d.w0;
      const unsigned* W1 = Wl + d.w1;
      const act_t* S0 = SBl + d.s0;
      const act_t* S1 = SBl + d.s1;
      auto rows_of = [&](int tile) {
        const int blo = min(d.swiglu ? tile : 2 * tile, nb - 1);
        const int bhi = min(d.swiglu ? tile : 2 * tile + 1, nb - 1);
        const uint2* wlo = reinterpret_cast<const uint2*>(W0) + (long)blo * ng * 32 + g * 4 + tig;
        const uint2* whi =
            reinterpret_cast<const uint2*>(d.swiglu ? W1 : W0) + (long)bhi * ng * 32 + g * 4 + tig;
        const act_t* sb = tig == 0 ? S0 + (long)blo * ng * 8
                        : tig == 1 ? S0 + sb_half + (long)blo * ng * 8
                        : tig == 2 ? (d.swiglu ? S1 : S0) + (long)bhi * ng * 8
                                   : (d.swiglu ? S1 : S0) + sb_half + (long)bhi * ng * 8;
        return Rows{wlo, whi, sb + g};
      };
      int tile = rank + C * slot;
      Rows rw = rows_of(tile);
      Batch<UG> A, B;
      if (work) fetch(A, rw, ga, gb);  // before the barrier: weights do not depend on the chain
      if (l + s > 0) cluster_wait();
      if (rank == 0 && tid == 0) stamps[l * nst + s] = now_ns();
      // Stage the input (the other blocks' outputs are in xbuf[par]) as gemv4 does.
      const float* xin = xbuf + par * XMAX;
      float q = 0.f;
      for (int base = wid * 32; base < nw; base += NT) {
        const int p = base + lane;
        float sum = 0.f;
        if (p < nw) {
          float f[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) { f[j] = xin[8 * p + j]; q += f[j] * f[j]; }
          const uint4 v = pack8(f);
          const act_t* e = reinterpret_cast<const act_t*>(&v);
#pragma unroll
          for (int j = 0; j < 8; ++j) sum += cv(e[j]);
          xs[p] = make_uint4(prmt(v.x, v.z, 0x5410), prmt(v.x, v.z, 0x7632), prmt(v.y, v.w, 0x5410),
                             prmt(v.y, v.w, 0x7632));
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        if (p < nw && (lane & 7) == 0) sx[(p >> 3) * 8] = sum;
      }
      // d.norm is the same for the whole block: block_sum's barriers are reached by all.
      const float inv = d.norm ? rsqrtf(block_sum(q, rsum) / d.in + 1e-6f) : 1.f;
      __syncthreads();
      float* xout = xbuf + (par ^ 1) * XMAX;
      const uint4* xrow = xs + 2 * tig;
      for (int r = 0; r < rounds; ++r) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int g0 = ga; work && g0 < gb; g0 += 2 * UG) {
          fetch(B, rw, g0 + UG, gb);
          compute<1, UG>(A, g0, gb, xrow, sx, g, tig, acc);
          fetch(A, rw, g0 + 2 * UG, gb);
          compute<1, UG>(B, g0 + UG, gb, xrow, sx, g, tig, acc);
        }
        const int next = tile + C * slots;
        if (work && r + 1 < rounds) {
          rw = rows_of(next);
          fetch(A, rw, ga, gb);
        }
        *reinterpret_cast<float4*>(red + (wid * 32 + lane) * 4) =
            make_float4(acc[0], acc[1], acc[2], acc[3]);
        __syncthreads();
        for (int idx = tid; idx < slots * ROWS; idx += NT) {
          const int sl = idx / ROWS, lr = idx - sl * ROWS;
          const int row = (rank + C * (sl + r * slots)) * ROWS + lr;
          if (row >= d.out) continue;
          const int src = (lr & 7) * 16 + (d.swiglu ? 0 : (lr >> 3) * 2);
          float v0 = 0.f, v1 = 0.f;
          for (int k = 0; k < KS; ++k) {
            v0 += red[(sl * KS + k) * 128 + src];
            if (d.swiglu) v1 += red[(sl * KS + k) * 128 + src + 2];
          }
          const float y = d.swiglu ? silu_f(v0 * inv) * (v1 * inv) : v0 * inv;
          for (int b = 0; b < C; ++b) store_remote(xout + row, b, y);
        }
        __syncthreads();
        tile = next;
      }
      cluster_arrive();
      par ^= 1;
    }
  }
  cluster_wait();
  if (rank == 0)
    for (int i = tid; i < STAGE_LAST_OUT; i += NT) out[i] = xbuf[par * XMAX + i];
}
"""


def stage_table():
    """Each stage's (rows, columns, SwiGLU, norm, (words, entries) of its first matrix, of
    its last), each matrix's (codes offset in words, scales offset in entries, rows,
    columns), and a layer's words and entries."""
    desc, mats = [], []
    words = sb = 0
    for out, cols, swiglu, norm in STAGES:
        ng = cols // 64
        nb = (out + 7) // 8
        offs = []
        for _ in range(2 if swiglu else 1):
            offs.append((words, sb))
            mats.append((words, sb, out, cols))
            words += nb * ng * 64
            sb += nb * ng * 8
        desc.append((out, cols, swiglu, norm, offs[0], offs[-1]))
    return desc, mats, words, sb


def warps_a_tile(out: int, swiglu: int, clusters: int, warps: int) -> int:
    """Warps sharing a tile: as many as keep every warp of the cluster busy, up to 8."""
    tiles = (out + (8 if swiglu else 16) - 1) // (8 if swiglu else 16)
    ks = 1
    while ks < 8 and tiles * ks * 2 <= clusters * warps:
        ks *= 2
    return ks


def dequant(codes: np.ndarray, sb: np.ndarray, sb_half: int, w: int, s: int, out: int, cols: int):
    """The float64 matrix of one 4-bit weight in 8-row blocks (gemv4.cu's layout)."""
    ng, nb = cols // 64, (out + 7) // 8
    c = codes[w : w + nb * ng * 64].reshape(nb, ng, 8, 8).astype(np.uint64)
    q = np.stack([(c >> (4 * j)) & 15 for j in range(8)], axis=-1).astype(np.float64)
    q = q.transpose(0, 2, 1, 3, 4).reshape(nb * 8, cols)
    sc = sb[s : s + nb * ng * 8].reshape(nb, ng, 8).transpose(0, 2, 1).reshape(nb * 8, ng)
    bi = sb[sb_half + s : sb_half + s + nb * ng * 8].reshape(nb, ng, 8).transpose(0, 2, 1)
    bi = bi.reshape(nb * 8, ng)
    return (np.repeat(sc, 64, axis=1) * q + np.repeat(bi, 64, axis=1))[:out]


def reference(codes, sb, sb_half, mats, x0: np.ndarray) -> np.ndarray:
    """One layer's chain on the host in float64 (inputs rounded to bf16 as staged)."""

    def bf16(v):
        u = v.astype(np.float32).view(np.uint32)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.view(np.float32).astype(np.float64)

    x, m = x0.astype(np.float64), 0
    for out, cols, swiglu, norm in STAGES:
        xin = bf16(x[:cols])
        inv = 1.0 / np.sqrt((x[:cols] ** 2).mean() + 1e-6) if norm else 1.0
        w0 = dequant(codes, sb, sb_half, mats[m][0], mats[m][1], out, cols)
        y = w0 @ xin * inv
        if swiglu:
            w1 = dequant(codes, sb, sb_half, mats[m + 1][0], mats[m + 1][1], out, cols)
            u = w1 @ xin * inv
            y = y / (1.0 + np.exp(-y)) * u
        m += 2 if swiglu else 1
        x = y
    return x


def run(clusters: int, warps: int, ug: int, layers: int, modes: list[str], replays: int) -> dict:
    import cupy

    from engine.backends.cuda.launch import sm_count
    from engine.backends.cuda.modules import options, source

    desc, mats, layer_words, layer_sb = stage_table()
    half = layer_sb  # biases after the scales, within one layer's block of entries
    layer_sb2 = 2 * layer_sb
    code = source("gemv4_parts.cuh")
    defines = "".join(
        f"#define {k} {v}\n"
        for k, v in (("XMAX", XMAX), ("STAGE0_IN", STAGES[0][1]), ("STAGE_LAST_OUT", STAGES[-1][0]))
    )
    name = f"cluster_chain<{clusters},{warps},{ug}>"
    mod = cupy.RawModule(
        code=defines + code + SOURCE, options=options("bfloat16"), name_expressions=[name]
    )
    fn = mod.get_function(name)
    smem = 4 * (2 * XMAX) + 16 * (XMAX // 8) + 4 * (XMAX // 8) + 4 * 4 * warps * 32
    fn.max_dynamic_shared_size_bytes = smem
    if clusters > 8:  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        from cupy_backends.cuda.api import driver

        driver.funcSetAttribute(fn.kernel.ptr, 14, 1)
    dt = np.dtype(
        [
            ("out", "i4"),
            ("in", "i4"),
            ("swiglu", "i4"),
            ("norm", "i4"),
            ("ks", "i4"),
            ("pad", "i4"),
            ("w0", "i8"),
            ("w1", "i8"),
            ("s0", "i8"),
            ("s1", "i8"),
        ]
    )
    rows = []
    for out, cols, swiglu, norm, (w0, s0), (w1, s1) in desc:
        ks = warps_a_tile(out, swiglu, clusters, warps)
        rows.append((out, cols, swiglu, norm, ks, 0, w0, w1, s0, s1))
    sd = cupy.asarray(np.array(rows, dtype=dt).view(np.uint8))
    rng = np.random.default_rng(0)
    codes = cupy.asarray(rng.integers(0, 2**32, size=layers * layer_words, dtype=np.uint32))
    sb_host = np.empty(layers * layer_sb2, np.float32)
    sb_host[:] = rng.uniform(-0.02, 0.02, sb_host.size)
    sb_bits = (sb_host.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation
    sb = cupy.asarray(sb_bits)
    x0 = rng.standard_normal(STAGES[0][1]).astype(np.float32)
    x0_d = cupy.asarray(x0)
    out = cupy.zeros(STAGES[-1][0], cupy.float32)
    progress = cupy.zeros(2, cupy.uint32)  # the layer cluster 0 has begun; prefetch gave up
    stamps = cupy.zeros(layers * len(STAGES), cupy.uint64)
    grid_all = (sm_count() // clusters) * clusters
    res = {}
    for mode in modes:
        resident = mode in ("resident", "exchange")
        ahead = int(mode.split(":")[1]) if mode.startswith("l2:") else -1
        grid = grid_all if ahead >= 0 else clusters
        args = (
            codes,
            sb,
            sd,
            np.int32(len(STAGES)),
            np.int32(layers),
            np.int64(layer_words),
            np.int64(layer_sb2),
            np.int64(half),
            np.int32(resident),
            np.int32(ahead),
            np.int32(mode != "exchange"),
            x0_d,
            out,
            progress,
            stamps,
        )
        times = []
        for _ in range(replays):
            progress.fill(0)
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record()
            fn((grid,), (warps * 32,), args, shared_mem=smem)
            e1.record()
            e1.synchronize()
            times.append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3)
        st = cupy.asnumpy(stamps).astype(np.float64).reshape(layers, len(STAGES))
        gaps = np.diff(st.reshape(-1)) / 1e3  # block 0: stage start to the next stage's start
        per_stage = [float(gaps[s :: len(STAGES)].mean()) for s in range(len(STAGES) - 1)]
        row = {"us_per_layer": float(np.median(times)) / layers, "stage_us": per_stage}
        row["prefetch_gave_up"] = bool(int(progress[1]))
        if mode == "resident" and layers == 1:
            sb_f = (sb_bits[:layer_sb2].astype(np.uint32) << 16).view(np.float32)
            want = reference(
                cupy.asnumpy(codes[:layer_words]), sb_f.astype(np.float64), half, mats, x0
            )
            got = cupy.asnumpy(out).astype(np.float64)
            row["rel_err"] = float(np.abs(got - want).max() / np.abs(want).max())
        res[mode] = row
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", default="8,16", help="SMs in the cluster that runs the chain")
    ap.add_argument("--warps", type=int, default=16)
    ap.add_argument("--ug", type=int, default=4, help="groups a warp requests at a time")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--modes", default="resident,hbm,l2:1,l2:2")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    modes = args.modes.split(",")
    results = []
    for c in (int(v) for v in args.clusters.split(",")):
        try:
            check = run(c, args.warps, args.ug, 1, ["resident"], 3)["resident"]
            got = run(c, args.warps, args.ug, args.layers, modes, args.replays)
        except Exception as e:  # a cluster the GPU does not launch: say so and go on
            print(f"cluster of {c}: {type(e).__name__}: {e}")
            continue
        for mode, r in got.items():
            results.append({"cluster": c, "mode": mode, "check_rel_err": check.get("rel_err"), **r})
    lines = [
        f"0.8B DeltaNet layer's four projections, {args.layers} layers, one cluster, "
        f"{args.warps} warps a block, {args.ug} groups a load; kernel-level us",
        "",
        "| cluster | mode | us a layer | input group / out_proj / gate-up (block 0) | check |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        st = " / ".join(f"{v:.2f}" for v in r["stage_us"])
        err = "-" if r["check_rel_err"] is None else f"{r['check_rel_err']:.1e}"
        lines.append(f"| {r['cluster']} | {r['mode']} | {r['us_per_layer']:.2f} | {st} | {err} |")
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_cluster_chain.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
