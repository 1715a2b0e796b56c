"""Decode-sized projections (1 to 8 rows): kernel choice, tuning and launch.

Two kernels: `gemv4.cu` (tensor cores, MLX 4-bit g64 weights, half activations) and the
SIMT `gemv.cu` (any bits, dense weights, fp32). `gemv4` can also compute its own input from
the previous block's outputs (a prologue, `Pro`): the residual add and RMSNorm before every
projection, or the DeltaNet's gated per-head norm before out_proj. Each block recomputes the
norm of the (one to eight) input rows it stages, which is cheap next to the weights it
streams, and saves a kernel boundary per norm.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from engine.backends.cuda.launch import compute_capability, on_stream, or_null, sm_count
from engine.backends.cuda.weights import QWeight

i32, f32 = np.int32, np.float32
GEMV_MAX_ROWS = 8
# (rows per warp, 16-byte chunks in flight per lane and row)
GEMV_VARIANTS = ((1, 4), (2, 4), (4, 2), (4, 4))
GEMV_SWIGLU_VARIANTS = ((2, 4), (2, 2), (2, 8))
# Tensor-core kernel for 4-bit g64 weights and half activations (gemv4.cu):
# (warps per 16-row tile or 0 = enough for at most `groups` groups each, tiles per block,
#  groups per load step, next step prefetched, slice staged in shared memory by cp.async)
GEMV4_VARIANTS = (
    (4, 2, 2, True, False),
    (8, 1, 4, True, False),
    (16, 1, 2, True, False),
    (2, 4, 4, True, False),
    (32, 1, 2, True, False),
    (0, 1, 8, False, False),
    (0, 2, 8, False, False),
    (0, 4, 8, False, False),
    (0, 2, 4, False, False),
    (0, 1, 8, False, True),
    (0, 2, 8, False, True),
    (0, 4, 8, False, True),
    (0, 1, 16, False, True),
    (0, 2, 16, False, True),
    (0, 1, 4, False, True),
    (0, 2, 4, False, True),
)
GEMV4_MAXT = 768  # largest block of the auto-sized variants (512 when staged: 64 registers)
GRID_CAP = 132 * 16  # blocks for grid-stride kernels
# A prologue is recomputed by every block, once: the grid is capped at what the GPU holds
# at once (blocks loop over tiles), so even the LM head's 248,320 rows take one norm per
# resident block, about 500 at the 4B, instead of a separate norm kernel and its boundary.
PRO_MAX_OUT = 1 << 24
PRO_SUMS = 256  # shared-memory slots for the prologue's row (or head) sums


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Pro:
    """A gemv4 prologue. kind 1: stage `rms_norm(x + delta) * norm` (delta may be None) and
    store `x + delta` to `h` (None: not stored). kind 2: stage
    `rms_norm_per_head(o) * norm * silu(x)` with heads of `head_dim` values (o fp32)."""

    kind: int
    norm: Any
    eps: float
    delta: Any = None
    h: Any = None
    o: Any = None
    head_dim: int = 0


_GEMV_CHOICES: dict[str, dict[tuple, tuple]] = {}
# Per dtype: each tuned key's candidates, fastest alone first (DecodeGraphs.tune tries the
# closest ones in the whole step).
_GEMV_RANKED: dict[str, dict[tuple, list]] = {}
# Per dtype: the decode steps (their choice keys, in order) whose variants the whole-step
# tuning has already chosen: a later load of the same shapes keeps those choices, so the
# same request gets the same tokens in one process.
_STEP_TUNED: dict[str, set[tuple]] = {}


def best_replay_s(graph: Any, stream: Any, reps: int) -> float:
    """Seconds of the fastest of `reps` replays of a captured CUDA graph (timed with events)."""
    import cupy

    best = float("inf")
    for _ in range(reps):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / 1e3)
    return best


class GemvMixin:
    """Projection methods of `Ops` (which provides dtype, launch, allow_smem and k).

    `variant_filter` (a predicate on a candidate tuple, None for all) narrows what the
    tuner may choose; tools/bench_decode.py uses it to compare whole decode steps."""

    variant_filter: Any = None
    gemv_wave_fraction = 1.0
    _mma_ok = True  # the GPU runs gemv4 (compute capability 8.0+; set with _smem_optin)
    # gemv4's variants that stage each warp's weights in shared memory among the tuner's
    # candidates. Off: they win some shapes timed alone but not whole decode steps
    # (tools/bench_decode.py's "registers" row: 512 against 480 tok/s at b0ecf60, level or
    # better in every run before).
    staged_gemv = False
    # A measurement (tools/stamp_step.py --late): gemv4 requests its first weights after
    # staging its activations instead of before waiting for the previous kernel.
    gemv_weights_late = False
    # Extra -D flags for gemv4.cu (tools/stamp_step.py compiles its timing records in).
    gemv4_defines: tuple[str, ...] = ()

    @staticmethod
    def _wargs(w: Any) -> tuple[Any, Any, Any]:
        if isinstance(w, QWeight):
            return w.packed, w.scales, w.biases
        return w.data, w.data, w.data  # scales/biases unused for dense weights

    def gemv_ok(self, w: Any, rows: int) -> bool:
        if rows > GEMV_MAX_ROWS:
            return False
        cols = w.shape[1]
        if isinstance(w, QWeight):
            if w.blocked:  # only gemv4 reads 8-row blocks
                return self._gemv4_room(rows, cols)
            return (cols * w.bits) % 128 == 0
        return (cols * self.act_itemsize) % 16 == 0

    def blocks_ok(self, bits: int, group_size: int, cols: int) -> bool:
        """Whether a quantized matrix is stored in 8-row blocks (weights.QWeight.blocked):
        where gemv4 reads it (4-bit g64, half activations, compute capability 8.0+, a row's
        input fits its shared memory) and an 8-row block fits `to_blocks`' (4 bytes a
        column)."""
        if self.dtype == "float32" or bits != 4 or group_size != 64 or cols % 64:
            return False
        return self._gemv4_room(1, cols) and 4 * cols <= self._smem_optin

    def pro_ok(self, x: Any, w: Any, kind: int, head_dim: int = 0) -> bool:
        """Whether gemv4 can run `x @ w.T` with prologue `kind` (else: separate kernels)."""
        R, cols = x.shape
        if R > GEMV_MAX_ROWS or not self._gemv4_ok(x, w) or x.data.ptr % 16:
            return False
        if x.strides[1] != x.itemsize or x.strides[0] % 16:
            return False
        if kind == 1:
            return w.shape[0] <= PRO_MAX_OUT and R <= PRO_SUMS
        seg = head_dim // 8
        return (
            head_dim % 8 == 0
            and 0 < seg <= 32
            and seg & (seg - 1) == 0
            and cols % head_dim == 0
            and R * (cols // head_dim) <= PRO_SUMS
        )

    def gemv(self, x: Any, w: Any, out: Any, up: Any = None, pro: Pro | None = None) -> None:
        """out[m] = x[m] @ w.T for m < rows <= 8; with `up`, out = silu(x@w.T) * (x@up.T);
        with `pro` (gemv4 only, see `pro_ok`), x is first transformed as `Pro` says.

        The kernel and its variant are picked per shape by timing each candidate once
        (outside graph capture); the choice is cached for the process.
        """
        key = self.gemv_key(x, w, up, pro)
        choice = self.gemv_choice.get(key)
        if choice is None:
            choice = self._tune_gemv(key, x, w, out, up, pro)
        if self.graphing:
            self.step_keys.append(key)
        self.gemv_run(choice, x, w, out, up, pro)

    @staticmethod
    def gemv_key(x: Any, w: Any, up: Any = None, pro: Pro | None = None) -> tuple:
        """What a tuned choice is cached under: (bits, rows, out, in, swiglu, prologue kind,
        8-row blocks): the two orders of a matrix run different kernels."""
        q = isinstance(w, QWeight)
        bits, blocked = (w.bits, w.blocked) if q else (0, False)
        kind = pro.kind if pro else 0
        return (bits, x.shape[0], w.shape[0], x.shape[1], up is not None, kind, blocked)

    def gemv_candidates(self, x: Any, w: Any, up: Any = None, pro: Pro | None = None) -> list:
        """Kernel variants that can run this product: ('mma', ks, tpb, ug, pipe, staged) for
        gemv4 (4-bit weights in 8-row blocks), else ('old', rpw, u) for the SIMT kernel."""
        if self._gemv4_ok(x, w):
            cands = [("mma", *v) for v in GEMV4_VARIANTS if self._gemv4_fits(x, w, v)]
        else:
            assert pro is None, "only gemv4 has prologues"
            cands = [
                ("old", *v) for v in (GEMV_SWIGLU_VARIANTS if up is not None else GEMV_VARIANTS)
            ]
        if self.variant_filter is not None:
            return [c for c in cands if self.variant_filter(c)] or cands
        if not self.staged_gemv:
            kept = [c for c in cands if c[0] == "mma" and not c[5]]
            cands = kept or cands
        return cands

    def gemv_run(self, choice: tuple, x, w, out, up=None, pro: Pro | None = None) -> None:
        if choice[0] == "mma":
            self._gemv4_launch(x, w, out, up, pro, *choice[1:])
        else:
            assert pro is None, "the SIMT kernel has no prologue"
            self._gemv_launch(x, w, out, up, *choice[1:])

    def _gemv4_smem(
        self, rows: int, cols: int, threads: int, async_ug: int = 0, kind: int = 1
    ) -> int:
        """Dynamic shared bytes of gemv4 (gemv4.cu's layout); a prologue (kind != 0) keeps
        its norm weight there too."""
        xs_sx_red = rows * (cols // 8 + 1) * 16 + cols // 64 * 32 + threads * 16
        return xs_sx_red + threads * 20 * async_ug + (cols * 4 if kind else 0)

    @staticmethod
    def _gemv4_shape(cols: int, v: tuple) -> tuple[int, int]:
        """(warps per tile, threads per block) of variant v for rows of `cols` columns."""
        ks, tpb, ug = v[0], v[1], v[2]
        if ks == 0:
            maxt = 512 if v[4] else GEMV4_MAXT
            ks = max(1, min(_cdiv(cols // 64, ug), maxt // (32 * tpb)))
        return ks, 32 * ks * tpb

    def _gemv4_fits(self, x: Any, w: Any, v: tuple) -> bool:
        """An ASYNC variant stages each warp's whole slice: it must be at most `ug` groups
        (scales copied in aligned pairs: an even group count) and fit in shared memory."""
        if not v[4]:
            return True
        cols, ug = w.shape[1], v[2]
        ks, threads = self._gemv4_shape(cols, v)
        return (
            _cdiv(cols // 64, ks) <= ug
            and self._gemv4_smem(x.shape[0], cols, threads, ug) <= self._smem_optin - 1024
        )

    def _mma(self) -> bool:
        """Whether the GPU runs gemv4 (queried once, with its shared memory limit)."""
        if self._smem_optin is None:
            import cupy

            dev = cupy.cuda.Device()
            self._smem_optin = cupy.cuda.runtime.deviceGetAttribute(97, dev.id)  # opt-in max
            # mma.m16n8k16 on half types and cp.async need compute capability 8.0: older
            # cards (GTX 16xx, RTX 20xx, in fp16) run the SIMT kernel and separate norms.
            self._mma_ok = compute_capability() >= 80
        return self._mma_ok

    def _gemv4_room(self, rows: int, cols: int) -> bool:
        """Whether gemv4's staged input of `rows` rows fits in shared memory."""
        return self._mma() and self._gemv4_smem(rows, cols, 1024) <= self._smem_optin

    def _gemv4_ok(self, x: Any, w: Any) -> bool:
        if self.dtype == "float32" or not isinstance(w, QWeight) or not w.blocked:
            return False
        return self._gemv4_room(x.shape[0], w.shape[1])

    def _gemv4_launch(self, x, w, out, up, pro, *v) -> None:
        R, cols = x.shape
        n_out = w.shape[0]
        swiglu = up is not None
        kind = pro.kind if pro else 0
        if kind == 2 and self.dtype == "bfloat16" and pro.head_dim % 64 == 0:
            kind = 5  # one pass: each group's sum scaled by its head's norm (gemv4_parts.cuh)
        fn = self._gemv4_fn(R, swiglu, v, kind)
        _, tpb, ug, _, staged = v
        ks, threads = self._gemv4_shape(cols, v)
        assert not staged or _cdiv(cols // 64, ks) <= ug, "a staged slice must fit"
        smem = self._gemv4_smem(R, cols, threads, ug if staged else 0, kind)
        self.allow_smem(fn, (R, swiglu, v, kind), smem)  # beside 1 KiB of prologue sums
        rows = 8 if swiglu else 16
        blocks = _cdiv(_cdiv(n_out, rows), tpb)
        grid = (min(blocks, self._gemv4_resident(fn, threads, smem)),)
        a = self._wargs(w)
        b = self._wargs(up) if swiglu else a
        ldx = x.strides[0] // x.itemsize
        args = (*a, *b, x, i32(ldx), out, i32(out.shape[1]), i32(n_out), i32(cols))
        args += (*self._pro_args(pro), i32(self.gemv_weights_late))
        self.launch(fn, grid, (threads,), args, smem)

    @staticmethod
    def _pro_args(pro: Pro | None) -> tuple:
        """The prologue's kernel arguments (d, nw, h, o, hd, eps), null pointers where unused."""
        if pro is None:
            return (*(or_null(None),) * 4, i32(0), f32(0))
        return (
            or_null(pro.delta),
            pro.norm,
            or_null(pro.h),
            or_null(pro.o),
            i32(pro.head_dim),
            f32(pro.eps),
        )

    def _gemv4_resident(self, fn: Any, threads: int, smem: int) -> int:
        """Blocks of `fn` the whole GPU holds at once (times `gemv_wave_fraction`): the
        grid is capped there and blocks loop over the remaining tiles."""
        key = (fn.kernel.ptr, threads, smem)
        n = self._resident.get(key)
        if n is None:
            from cupy_backends.cuda.api import driver

            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem)
            n = self._resident[key] = max(1, per_sm) * sm_count()
        return max(1, int(n * self.gemv_wave_fraction))

    @staticmethod
    def _gemv4_sym(R: int, swiglu: bool, v: tuple, kind: int) -> str:
        ks, tpb, ug, pipe, staged = v
        maxt = 32 * ks * tpb if ks else (512 if staged else GEMV4_MAXT)
        sw, pp, st = ("true" if b else "false" for b in (swiglu, pipe, staged))
        return f"gemv4<{R},{sw},{tpb},{ug},{pp},{maxt},{kind},{st}>"

    def _gemv4_fn(self, R: int, swiglu: bool, v: tuple, kind: int = 0) -> Any:
        """One module per (rows, swiglu, prologue) holding every variant: one compile, not nine."""
        import cupy

        from engine.backends.cuda.modules import ACT_KINDS, _source

        sym = self._gemv4_sym(R, swiglu, v, kind)
        fn = self._gemv4_mods.get(sym)
        if fn is not None:
            return fn
        mod = self._gemv4_mods.get((R, swiglu, kind))
        if mod is None:
            names = [self._gemv4_sym(R, swiglu, c, kind) for c in GEMV4_VARIANTS]
            opts = ("-std=c++17", f"-DACT_KIND={ACT_KINDS[self.dtype]}")
            opts += tuple(f"-D{d}" for d in self.gemv4_defines)
            mod = cupy.RawModule(code=_source("gemv4.cu"), options=opts, name_expressions=names)
            self._gemv4_mods[(R, swiglu, kind)] = mod
        fn = self._gemv4_mods[sym] = mod.get_function(sym)
        return fn

    def _gemv_launch(self, x, w, out, up, rpw: int, u: int) -> None:
        R, cols = x.shape
        n_out = w.shape[0]
        swiglu = up is not None
        bits = w.bits if isinstance(w, QWeight) else 0
        sym = f"gemv<{bits},{R},{rpw},{'true' if swiglu else 'false'},{u}>"
        groups = n_out if swiglu else _cdiv(n_out, rpw)
        grid = (max(1, min(_cdiv(groups, 8), GRID_CAP)),)
        a = self._wargs(w)
        b = self._wargs(up) if swiglu else a
        g = w.group_size if bits else 64
        args = (*a, *b, x, i32(cols), out, i32(out.shape[1]), i32(n_out), i32(cols), i32(g))
        self.launch(self.k("gemv.cu", sym), grid, (256,), args)

    def step_candidates(self, key: tuple, keep: int | None) -> list:
        """What the decode step's own tuning (DecodeGraphs.tune) tries for a choice key: the
        `keep` fastest alone (None: all), then every tensor-core variant that requests its
        whole slice at once, before the wait (not pipelined, not staged). Timed alone, with
        nothing before them, those rank low; in the step, where each launch's weights are
        requested while the previous kernel ends, they won every layer projection of the 4B
        when all candidates were tried (tools/bench_decode.py --search)."""
        ranked = self.gemv_ranked.get(key, [])
        at_once = [c for c in ranked if c[0] == "mma" and not c[4] and not c[5]]
        return list(dict.fromkeys(ranked[:keep] + at_once))

    def _tune_gemv(self, key, x, w, out, up, pro=None) -> tuple:
        import cupy

        cands = self.gemv_candidates(x, w, up, pro)
        current = cupy.cuda.get_current_stream()
        if current.is_capturing() or len(cands) == 1:
            return cands[0]
        # The candidates run on the caller's stream once its queue is empty, into buffers of
        # their own: timing never races with, or writes into, what the forward is using.
        current.synchronize()
        own_out = cupy.empty(out.shape, out.dtype)
        if pro is not None and pro.h is not None:
            pro = replace(pro, h=cupy.empty(pro.h.shape, pro.h.dtype))
        times = [self.time_gemv(c, x, w, own_out, up, pro=pro) for c in cands]
        ranked = [c for _, c in sorted(zip(times, cands, strict=True), key=lambda tc: tc[0])]
        self.gemv_ranked[key] = ranked
        self.gemv_choice[key] = ranked[0]
        return ranked[0]

    def time_gemv(self, choice: tuple, x, w, out, up=None, n: int = 8, pro=None) -> float:
        """GPU ms of n launches, each after a write that evicts the L2 (weights come from
        memory, as in a decode step), replayed as one CUDA graph; the writes cost the same for
        every candidate, so only the ranking means anything. A prologue that stores the
        residual stores the same values every time, so timing it changes nothing."""
        import cupy

        if self._l2_flush is None:
            dev = cupy.cuda.Device().id
            l2 = cupy.cuda.runtime.deviceGetAttribute(38, dev)  # L2 cache bytes
            self._l2_flush = cupy.empty(max(l2 * 5 // 4, 1 << 20), cupy.uint8)
        stream = cupy.cuda.get_current_stream()
        if stream.ptr == 0:  # the legacy default stream cannot be captured
            stream = cupy.cuda.Stream(non_blocking=True)
        with on_stream(stream):
            self.gemv_run(choice, x, w, out, up, pro)  # compile, set attributes, warm
            stream.begin_capture()
            for _ in range(n):
                self._l2_flush.fill(0)
                self.gemv_run(choice, x, w, out, up, pro)
            graph = stream.end_capture()
            graph.launch(stream)
            return best_replay_s(graph, stream, 2) * 1e3
