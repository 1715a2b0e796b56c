"""Projection chains: consecutive decode projections in one persistent launch.

A decode step alternates runs of projections (a layer's out_proj or o_proj, gate/up, down,
and the next layer's input projections) with short kernels (DeltaNet, attention). Launched
one by one, each projection pays a boundary: its blocks can only start, and request their
first weights, once the previous projection's blocks have left the GPU. `gemv4_chain` runs a
run of up to four as stages of one launch whose grid is exactly what the GPU holds at once:
between stages the blocks meet at a grid barrier, and each block requests its first weights
of the next stage before it arrives there, so memory keeps streaming through the barrier.

While `chaining` is set (by `DecodeGraphs` around a decode step's forward), `Ops.gemv` queues
each tensor-core projection instead of launching it; the queue is launched as chains before
any other kernel (`Ops.launch` and cuBLAS calls flush it) and at the end of the step. Each
chain's variant (threads, tiles per block, groups per load, blocks per SM) is tuned once per
shape by timing the whole chain outside any capture; a chain met first inside a capture runs
as separate launches.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from engine.backends.cuda.launch import launch_ex, on_stream

MAX_STAGES = 4
# (threads, tiles per block, groups per load step, blocks per SM the registers are sized for)
CHAIN_VARIANTS = (
    (256, 1, 2, 3),
    (256, 2, 2, 3),
    (256, 1, 4, 3),
    (256, 1, 2, 2),
    (512, 1, 2, 1),
    (512, 2, 2, 1),
)
_CHAIN_CHOICES: dict[str, dict[tuple, tuple]] = {}


class _Proj(ctypes.Structure):
    """`Proj` in gemv4.cu: one stage's weights, activations, output and prologue."""

    _fields_ = (
        [
            (name, ctypes.c_uint64)
            for name in ("W0", "S0", "B0", "W1", "S1", "B1", "X", "Y", "d", "nw", "h", "o")
        ]
        + [(name, ctypes.c_int32) for name in ("ldx", "ldy", "out", "inp", "hd")]
        + [("eps", ctypes.c_float)]
    )


class _Chain(ctypes.Structure):
    _fields_ = [("p", _Proj * MAX_STAGES)]


def _ptr(a: Any) -> int:
    return 0 if a is None else int(a.data.ptr)


class ChainMixin:
    """Chain methods of `Ops` (which provides gemv4's helpers, `launch` and the stream)."""

    chaining = False
    chains_enabled = True  # off: every projection its own launch (benchmarks compare)

    def _chain_init(self, dtype: str) -> None:
        self._pending: list[tuple] = []
        self._bar: Any = None  # the grid barrier's {arrivals, generation}
        self.chain_choice: dict[tuple, tuple] = _CHAIN_CHOICES.setdefault(dtype, {})

    def defer(self, choice: tuple, x, w, out, up, pro) -> bool:
        """Queue a projection for a chain (while `chaining`, tensor-core variants only)."""
        if not (self.chaining and self.chains_enabled) or choice[0] != "mma":
            return False
        self._pending.append((x, w, out, up, pro, choice))
        return True

    def flush(self) -> None:
        """Launch every queued projection, in order: runs of up to four with the same row
        count as chains, a run of one as itself."""
        pending, self._pending = self._pending, []
        i = 0
        while i < len(pending):
            rows = pending[i][0].shape[0]
            j = i + 1
            while j < len(pending) and j - i < MAX_STAGES and pending[j][0].shape[0] == rows:
                j += 1
            run = pending[i:j]
            if len(run) == 1 or not self._chain(run):
                for x, w, out, up, pro, choice in run:
                    self.gemv_run(choice, x, w, out, up, pro)
            i = j

    @staticmethod
    def chain_key(run: list[tuple]) -> tuple:
        """(rows, then per stage: code = prologue + 4 * swiglu, out, in)."""
        key: list[Any] = [run[0][0].shape[0]]
        for _x, w, _out, up, pro, _c in run:
            key += [(pro.kind if pro else 0) + 4 * (up is not None), w.shape[0], w.shape[1]]
        return tuple(key)

    def _chain(self, run: list[tuple]) -> bool:
        """Launch `run` as one chain; False when it must run stage by stage instead."""
        import cupy

        key = self.chain_key(run)
        choice = self.chain_choice.get(key)
        capturing = cupy.cuda.get_current_stream().is_capturing()
        if choice is None or self._bar is None:
            if capturing:
                return False
            if self._bar is None:
                self._bar = cupy.zeros(2, cupy.uint32)
            choice = self.chain_choice[key] = self._tune_chain(run)
        self.chain_run(choice, run)
        return True

    def _chain_fn(self, R: int, codes: tuple[int, ...], v: tuple) -> Any:
        import cupy

        from engine.backends.cuda.modules import ACT_KINDS, _source

        def sym(c: tuple) -> str:
            nt, tpb, ug, minb = c
            padded = list(codes) + [0] * (MAX_STAGES - len(codes))
            return (
                f"gemv4_chain<{R},{tpb},{ug},{nt},{minb},{len(codes)},{','.join(map(str, padded))}>"
            )

        name = sym(v)
        fn = self._gemv4_mods.get(name)
        if fn is None:
            mod = self._gemv4_mods.get(("chain", R, codes))
            if mod is None:
                opts = ("-std=c++17", f"-DACT_KIND={ACT_KINDS[self.dtype]}")
                names = [sym(c) for c in CHAIN_VARIANTS]
                mod = cupy.RawModule(code=_source("gemv4.cu"), options=opts, name_expressions=names)
                self._gemv4_mods[("chain", R, codes)] = mod
            fn = self._gemv4_mods[name] = mod.get_function(name)
        return fn

    def chain_run(self, v: tuple, run: list[tuple]) -> None:
        """Launch `run` (queued projections) as one gemv4_chain of variant `v`."""
        R = run[0][0].shape[0]
        key = self.chain_key(run)
        codes = tuple(key[1::3])
        fn = self._chain_fn(R, codes, v)
        nt = v[0]
        smem = max(self._gemv4_smem(R, w.shape[1], nt) for _x, w, *_ in run)
        if smem > 40 * 1024 and self._smem_set.get((R, codes, v), 0) < smem:
            fn.max_dynamic_shared_size_bytes = smem
            self._smem_set[(R, codes, v)] = smem
        chain = _Chain()
        for k, (x, w, out, up, pro, _c) in enumerate(run):
            b = up if up is not None else w
            p = chain.p[k]
            p.W0, p.S0, p.B0 = _ptr(w.packed), _ptr(w.scales), _ptr(w.biases)
            p.W1, p.S1, p.B1 = _ptr(b.packed), _ptr(b.scales), _ptr(b.biases)
            p.X, p.Y = _ptr(x), _ptr(out)
            p.ldx, p.ldy = x.strides[0] // x.itemsize, out.strides[0] // out.itemsize
            p.out, p.inp = w.shape[0], w.shape[1]
            if pro is not None:
                p.d, p.nw, p.h, p.o = _ptr(pro.delta), _ptr(pro.norm), _ptr(pro.h), _ptr(pro.o)
                p.hd, p.eps = pro.head_dim, pro.eps
        grid = (self._gemv4_resident(fn, nt, smem),)
        launch_ex(fn, grid, (nt,), (chain, self._bar), smem, pdl=self.pdl and self.graphing)

    def _tune_chain(self, run: list[tuple]) -> tuple:
        """The fastest chain variant, each timed as a graph of a few chains with the L2
        evicted before each. Every stage's output is a function of inputs the chain does
        not write, so running it again writes the same values."""
        import cupy

        from engine.backends.cuda.gemv import best_replay_s

        stream = cupy.cuda.get_current_stream()
        stream.synchronize()
        if self._l2_flush is None:
            dev = cupy.cuda.Device().id
            l2 = cupy.cuda.runtime.deviceGetAttribute(38, dev)  # L2 cache bytes
            self._l2_flush = cupy.empty(max(l2 * 5 // 4, 1 << 20), cupy.uint8)
        own = stream if stream.ptr else cupy.cuda.Stream(non_blocking=True)
        times = []
        with on_stream(own):
            for v in CHAIN_VARIANTS:
                self.chain_run(v, run)  # compile, set attributes, warm
                own.begin_capture()
                for _ in range(4):
                    self._l2_flush.fill(0)
                    self.chain_run(v, run)
                graph = own.end_capture()
                graph.launch(own)
                times.append(best_replay_s(graph, own, 2))
        own.synchronize()
        return CHAIN_VARIANTS[int(np.argmin(times))]
