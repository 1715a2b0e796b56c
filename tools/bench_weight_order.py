"""Read bandwidth of the decode projection's weight accesses, by weight order (GPU only).

No arithmetic: each kernel reads a 4B gate/up-sized 4-bit matrix (18432 x 2560: codes,
scales, biases, 26.5 MB) the way `gemv4` does, a 16-row tile per group of warps, each warp
a slice of the column groups, one barrier per tile, and keeps the bits alive. Orders:

- rows: MLX's order. A lane reads 8 bytes of rows g and g+8 of a group: a warp request
  touches eight rows' 128-byte lines for 32 bytes each.
- blocks: the engine's 8-row blocks (`QWeight.blocked`): the same 8-byte reads, each warp
  request 256 contiguous bytes.
- tiles16: 16 bytes a lane, a warp request 512 contiguous bytes (a tile's group in one load).
- plain: a grid-stride copy-like read of the codes, for scale.

Each case is a CUDA graph of launches rotating over 8 copies (nothing stays in L2), best of
5 replays. Prints a table and writes weight_order.json to --out.

    PYTHONPATH=. python3 tools/bench_weight_order.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from engine.backends.cuda.gemv import best_replay_s
from engine.backends.cuda.launch import on_stream, sm_count

SRC = r"""
__device__ __forceinline__ unsigned mix(unsigned a, unsigned b) { return a ^ (b * 2654435761u); }

// ORDER 0 rows, 1 blocks, 2 tiles16; SL groups a warp, KS warps a tile, TPB tiles a block.
template <int ORDER, int SL>
__global__ void read_tiles(const unsigned* __restrict__ W, const unsigned short* __restrict__ S,
                           const unsigned short* __restrict__ B, int rows, int ng, int KS, int TPB,
                           unsigned* out) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
  const int tl = wid / KS, ks = wid % KS, nw = ng * 8;
  const int tiles = rows / 16, VB = (tiles + TPB - 1) / TPB;
  const int ga = ks * SL, gb = min(ng, ga + SL);
  unsigned acc = 0;
  for (int vb = blockIdx.x; vb < VB; vb += gridDim.x) {
    const int t = vb * TPB + tl;
    if (t < tiles) {
      // All of the slice's loads first, then their use, as gemv4 issues a batch.
      uint4 a[SL];
      unsigned q[SL];
      const uint2* lo;
      const uint2* hi;
      const unsigned short* sb = tig & 1 ? B : S;
      const int r = tig >> 1;  // the scale (bias) of row g (0) or g + 8 (1)
      if constexpr (ORDER == 0) {
        lo = reinterpret_cast<const uint2*>(W + (long)(t * 16 + g) * nw) + tig;
        hi = reinterpret_cast<const uint2*>(W + (long)(t * 16 + g + 8) * nw) + tig;
        sb += (long)(t * 16 + g + 8 * r) * ng;
      } else {
        const uint2* w2 = reinterpret_cast<const uint2*>(W) + g * 4 + tig;
        lo = w2 + (long)(2 * t) * ng * 32;
        hi = w2 + (long)(2 * t + 1) * ng * 32;
        sb += (long)(2 * t + r) * ng * 8 + g;
      }
#pragma unroll
      for (int u = 0; u < SL; ++u) {
        const int gr = ga + u;
        if (gr >= gb) continue;
        if constexpr (ORDER == 2) {
          const long tg = (long)t * ng + gr;
          a[u] = __ldcs(reinterpret_cast<const uint4*>(W) + tg * 32 + lane);
          q[u] = lane < 16 ? __ldg(reinterpret_cast<const unsigned*>(S) + tg * 16 + lane) : 0u;
        } else {
          const int step = ORDER == 0 ? 4 : 32, sstep = ORDER == 0 ? 1 : 8;
          const uint2 x = __ldcs(lo + gr * step), y = __ldcs(hi + gr * step);
          a[u] = make_uint4(x.x, x.y, y.x, y.y);
          q[u] = __ldg(sb + gr * sstep);
        }
      }
#pragma unroll
      for (int u = 0; u < SL; ++u)
        if (ga + u < gb) acc = mix(acc, a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ q[u]);
    }
    __syncthreads();  // as gemv4 sums a tile's warps before the next
  }
  if (acc == 0x12345678u) out[threadIdx.x] = acc;
}

__global__ void read_plain(const uint4* __restrict__ W, long n, unsigned* out) {
  unsigned acc = 0;
  const long stride = (long)gridDim.x * blockDim.x;
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(W + i), b = __ldcs(W + i + stride), c = __ldcs(W + i + 2 * stride),
                d = __ldcs(W + i + 3 * stride);
    acc = mix(acc, a.x ^ b.y ^ c.z ^ d.w);
  }
  for (; i < n; i += stride) acc = mix(acc, W[i].x);
  if (acc == 0x12345678u) out[threadIdx.x] = acc;
}
"""
ORDERS = {"rows": 0, "blocks": 1, "tiles16": 2}
SLICES = (2, 4, 8)
COPIES = 8


def graph_us(stream, launch, n: int = 40) -> float:
    """Microseconds per launch: a graph of n launches over the copies, best of 5 replays."""
    with on_stream(stream):
        launch(0)
        stream.synchronize()
        stream.begin_capture()
        for i in range(n):
            launch(i % COPIES)
        graph = stream.end_capture()
        graph.launch(stream)
        return best_replay_s(graph, stream, 5) / n * 1e6


def main() -> None:
    import cupy
    from cupy_backends.cuda.api import driver

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=18432)
    ap.add_argument("--cols", type=int, default=2560)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    rows, cols = args.rows, args.cols
    assert rows % 16 == 0 and cols % 64 == 0, "rows a multiple of 16, columns of 64"
    ng = cols // 64
    names = [f"read_tiles<{o},{s}>" for o in ORDERS.values() for s in SLICES] + ["read_plain"]
    mod = cupy.RawModule(code=SRC, options=("-std=c++17",), name_expressions=names)
    plain = mod.get_function("read_plain")
    codes = [
        cupy.random.randint(0, 2**31, rows * cols // 8).astype(cupy.uint32) for _ in range(COPIES)
    ]
    sbs = [cupy.random.randint(0, 2**15, 2 * rows * ng).astype(cupy.uint16) for _ in range(COPIES)]
    out = cupy.zeros(1024, cupy.uint32)
    nbytes = rows * cols // 2 + rows * ng * 4
    sms = sm_count()
    stream = cupy.cuda.Stream(non_blocking=True)
    results = []
    for order, o in ORDERS.items():
        for sl in SLICES:
            fn = mod.get_function(f"read_tiles<{o},{sl}>")
            ks = -(-ng // sl)
            for tpb in (1, 2):
                threads = 32 * ks * tpb
                if threads > 1024:
                    continue
                per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, 0)
                grid = min(-(-(rows // 16) // tpb), per_sm * sms)

                def launch(c, fn=fn, grid=grid, threads=threads, ks=ks, tpb=tpb):
                    s, b = sbs[c][: rows * ng], sbs[c][rows * ng :]
                    fn(
                        (grid,),
                        (threads,),
                        (
                            codes[c],
                            s,
                            b,
                            np.int32(rows),
                            np.int32(ng),
                            np.int32(ks),
                            np.int32(tpb),
                            out,
                        ),
                    )

                us = graph_us(stream, launch)
                results.append(
                    dict(
                        order=order,
                        slice=sl,
                        tiles_per_block=tpb,
                        threads=threads,
                        blocks=grid,
                        us=us,
                        gb_s=nbytes / us / 1e3,
                    )
                )
    n16 = rows * cols // 32
    for per_sm, threads in ((4, 512), (8, 256)):

        def launch(c, g=per_sm * sms, threads=threads):
            plain((g,), (threads,), (codes[c], np.int64(n16), out))

        us = graph_us(stream, launch)
        results.append(
            dict(
                order="plain (codes only)",
                slice=0,
                tiles_per_block=0,
                threads=threads,
                blocks=per_sm * sms,
                us=us,
                gb_s=n16 * 16 / us / 1e3,
            )
        )
    print(f"{rows}x{cols} 4-bit g64, {nbytes / 1e6:.1f} MB a launch\n")
    print("| order | groups a warp | tiles a block | threads | blocks | us | GB/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['order']} | {r['slice'] or '-'} | {r['tiles_per_block'] or '-'} | "
            f"{r['threads']} | {r['blocks']} | {r['us']:.2f} | {r['gb_s']:.0f} |"
        )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "weight_order.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
