"""Every kernel instance the CUDA backend can request for a model, without a GPU.

`modules(config, specs, dtype, card)` walks what the forward (engine/models/qwen35.py) asks
of the backend, op by op, at every row count a decode kernel takes (1 to GEMV_MAX_ROWS; more
rows go to cuBLAS), and asks the same functions that pick the instances at run time:

    projections   blocked_layout, gemv_fits, prologue_fits, gemv4_kind, gemv4_module,
                  simt_symbol, dequant_symbol      (gemv_plan.py)
    DeltaNet      step_kernel, chunk_kernel        (deltanet.py)
    attention     decode_kernel (bf16 or 8-bit KV), prefill_kernel  (attention.py)
    embedding     embed_symbol (norms.py); the draw: draw_symbol (sampling.py)

Where something the catalog cannot see chooses between a fused launch and its fallback (an
input's alignment, a stored group), both are listed, so it holds whatever may run. Given a
load's batch-invariance setting (`invariant`), it lists what a load with that setting will
meet, for the compiles started at load (prebuild.py): that setting's attention instances
only and, out of batch-invariant mode, no SwiGLU launch without its add + norm where the
prologue fits (only an unaligned input would take it, and that compiles on request).

The result is a list of `Module`s, the NVRTC programs to compile: one a gemv4 (rows, SwiGLU,
prologue), as `Projections.gemv4_kernel` compiles them, and one a file for the rest, its
template instances as name expressions (the file's extern "C" kernels compile with them).
The backend checks every kernel it compiles against `requests(modules)`
(launch.Kernels.catalog); tests/engine/test_nvrtc_archs.py compiles the modules for each
architecture.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.backends.cuda.attention import decode_kernel, prefill_kernel
from engine.backends.cuda.card import Card, runs_mma
from engine.backends.cuda.deltanet import (
    SCAN,
    SCAN_KEEP,
    chunk_kernel,
    keep_step_kernel,
    step_kernel,
)
from engine.backends.cuda.gemv_plan import (
    GEMV_MAX_ROWS,
    TO_BLOCKS,
    Prologue,
    blocked_layout,
    dequant_symbol,
    gemv4_kind,
    gemv4_module,
    gemv_fits,
    prologue_fits,
    simt_symbol,
    simt_variants,
)
from engine.backends.cuda.gemv_tc import tc_applies, tc_symbol
from engine.backends.cuda.modules import source
from engine.backends.cuda.norms import embed_symbol
from engine.backends.cuda.sampling import draw_symbol
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.w4_mma import w4_applies, w4_symbol
from engine.backends.cuda.weights import fused_groups
from engine.checkpoint.names import MTP_LAYER
from engine.memory.scratch import ATTN_SPLITS
from engine.model_config import FULL, ModelConfig

# The most streams a decode step's attention grid is sized for in the catalog: its warps a
# block depend on splits x KV heads x rows only through their product (decode_kernel), so
# the fewest (1) and a count past any card's SMs cover every choice.
MANY_STREAMS = 1 << 16
FILES = (
    "quant.cu",
    "norm.cu",
    "sample.cu",
    "gemv.cu",
    "gemv_tc.cu",
    "gdn.cu",
    "gdn_chunk.cu",
    "gdn_chunk_tc.cu",
    "attention.cu",
    "attn_prefill.cu",
    "w4_mma.cu",
)


@dataclass(frozen=True)
class Module:
    """One NVRTC program: `kernels/<file>` with `names` as its name expressions."""

    file: str
    names: tuple[str, ...]
    defines: tuple[str, ...] = ()


@functools.cache
def extern_kernels(file: str) -> tuple[str, ...]:
    """The extern "C" kernels of `kernels/<file>` (compiled with any name expressions)."""
    found = _EXTERN.findall(source(file))
    return tuple(dict.fromkeys(found))


_EXTERN = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)')


@dataclass(frozen=True)
class _Weight:
    """A projection as its kernels see it: bits (0: dense), group size, in and out widths."""

    bits: int
    group: int
    cols: int
    n_out: int


def _weight(spec: Any) -> _Weight:
    q = spec.quant
    return _Weight(q.bits if q else 0, q.group_size if q else 0, spec.shape[1], spec.shape[0])


class _Walk:
    """What the backend's ops request, collected per file (template instances) and per gemv4
    module (rows, SwiGLU, prologue as its PRO argument)."""

    def __init__(self, dtype: str, card: Card, fallbacks: bool = True) -> None:
        self.dtype, self.smem, self.fallbacks = dtype, card.smem_per_block, fallbacks
        self.mma = runs_mma(card.capability)
        self.capability = card.capability
        self.isz = 4 if dtype == "float32" else 2
        self.gemv4: set[tuple[int, bool, int]] = set()
        self.files: dict[str, set[str]] = {f: set() for f in ("quant.cu", "norm.cu", "sample.cu")}

    def add(self, file: str, *symbols: str) -> None:
        self.files.setdefault(file, set()).update(symbols)

    def blocked(self, w: _Weight) -> bool:
        """Stored in 8-row blocks at load (weights._upload_group)."""
        return bool(w.bits) and blocked_layout(
            self.dtype, w.bits, w.group, w.cols, self.mma, self.smem
        )

    def stored(self, w: _Weight) -> None:
        """At load, and for every prompt-sized product: blocks, dequantization for cuBLAS."""
        if w.bits:
            self.add("quant.cu", dequant_symbol(w.bits, self.blocked(w)))
            if self.blocked(w):
                self.add("quant.cu", *TO_BLOCKS)
            if w4_applies(w.bits, w.group, w.cols, w.n_out, self.dtype, self.capability):
                self.add("w4_mma.cu", w4_symbol(self.blocked(w), self.smem))

    def linear(self, w: _Weight, R: int, swiglu: bool = False) -> None:
        """Projections.linear_into (and mlp's one launch with `swiglu`) at R rows."""
        blocked = self.blocked(w)
        if not gemv_fits(R, w.cols, w.bits, blocked, self.isz, self.mma, self.smem):
            return  # dequantized for cuBLAS: `stored` lists it
        if blocked:
            self.gemv4.add((R, swiglu, Prologue.NONE))
            return
        for rpw, u in simt_variants(swiglu):
            self.add("gemv.cu", simt_symbol(w.bits, R, rpw, swiglu, u))
        if not w.bits and tc_applies(R, w.cols, self.dtype, self.capability):
            self.add("gemv_tc.cu", tc_symbol(R, swiglu))

    def prologue(
        self, w: _Weight, R: int, kind: int, head_dim: int = 0, swiglu: bool = False
    ) -> bool:
        """Projections.pro_ok's one launch with the input computed by prologue `kind`;
        whether it fits."""
        args = (R, w.cols, w.n_out, kind, head_dim, self.blocked(w), self.dtype, self.mma)
        fits = prologue_fits(*args, self.smem)
        if fits:
            self.gemv4.add((R, swiglu, int(gemv4_kind(kind, self.dtype, head_dim))))
        return fits

    def group(self, parts: list[_Weight], fused: bool, R: int) -> None:
        """norm_linear_many over a layer's input projections: at one row a stored group runs
        as one product, with the add + norm as its prologue; else norm, then each part (in
        batch-invariant mode, a stored group's parts each with the add + norm)."""
        if fused and R == 1:
            whole = _Weight(
                parts[0].bits, parts[0].group, parts[0].cols, sum(p.n_out for p in parts)
            )
            self.prologue(whole, R, Prologue.ADD_NORM)
            self.linear(whole, R)
        for p in parts:
            if fused:
                self.prologue(p, R, Prologue.ADD_NORM)
            self.linear(p, R)

    def mlp(self, gate: _Weight, up: _Weight, down: _Weight, R: int) -> None:
        """norm_mlp: gate and up in one launch behind the add + norm, else mlp's one
        launch (same weight type), else each; then down."""
        if bool(gate.bits) == bool(up.bits):
            fused = self.prologue(gate, R, Prologue.ADD_NORM, swiglu=True)
            if self.fallbacks or not fused:
                self.linear(gate, R, swiglu=True)
        self.linear(gate, R)
        self.linear(up, R)
        self.linear(down, R)

    def modules(self) -> list[Module]:
        out = [Module("gemv4.cu", tuple(gemv4_module(*key))) for key in sorted(self.gemv4)]
        for file in FILES:
            if file in self.files:
                out.append(Module(file, tuple(sorted(self.files[file]))))
        return out


def modules(
    config: ModelConfig,
    specs: Mapping[str, Any],
    dtype: str,
    card: Card,
    tuning: Tuning | None = None,
    kv_cache: str = "bf16",
    invariant: bool | None = None,
) -> list[Module]:
    """The NVRTC programs holding every kernel instance the backend can request for this
    model (`specs`: internal name -> what has `.shape` and `.quant`, as
    engine.memory.arena.checkpoint_specs or engine.memory.shapes.shape_tensor_specs give),
    activation dtype and card; `kv_cache` "int8": the decode attention that reads the 8-bit
    cache (EngineSettings.kv_cache). `invariant` (EngineSettings.batch_invariant): None,
    every instance either setting may request; a bool, what a load with that setting meets
    (the module docstring)."""
    tuning = tuning or Tuning()
    walk = _Walk(dtype, card, fallbacks=invariant is not False)
    c = config
    fusable = {n for group in fused_groups(specs, list(specs)).values() for n in group}
    head_name = "embed_tokens" if c.tie_word_embeddings else "lm_head"
    embed, head = _weight(specs["embed_tokens"]), _weight(specs[head_name])
    if embed.bits:
        walk.add("quant.cu", embed_symbol(embed.bits, walk.blocked(embed)))
        if not c.tie_word_embeddings:  # the plan may keep it in host memory, in MLX's order
            walk.add("quant.cu", embed_symbol(embed.bits, False))
    walk.add("sample.cu", draw_symbol(True), draw_symbol(False))

    layers = []
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        if kind == FULL:
            names = [p + f"self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")]
            out = p + "self_attn.o_proj"
        else:
            names = [p + f"linear_attn.{n}" for n in ("in_proj_qkv", "in_proj_z", "in_proj_b")]
            names.append(p + "linear_attn.in_proj_a")
            out = p + "linear_attn.out_proj"
        mlp = [p + f"mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
        group = [_weight(specs[n]) for n in names]
        layers.append((kind, group, names[0] in fusable, _weight(specs[out]), mlp))
        for name in (*names, out, *mlp):
            walk.stored(_weight(specs[name]))
    mtp = "mtp.fc" in specs  # the MTP head (drafting): its fc, one full-attention layer
    if mtp:
        p = MTP_LAYER
        names = [p + f"self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")]
        mlp = [p + f"mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")]
        out = p + "self_attn.o_proj"
        layers.append((FULL, [_weight(specs[n]) for n in names], False, _weight(specs[out]), mlp))
        for name in ("mtp.fc", *names, out, *mlp):
            walk.stored(_weight(specs[name]))
    walk.stored(head)
    dv = c.linear_value_head_dim
    for R in range(1, GEMV_MAX_ROWS + 1):
        for kind, group, fused, out, mlp in layers:
            walk.group(group, fused, R)
            if kind != FULL:  # out_proj behind the gated norm, or apart
                walk.prologue(out, R, Prologue.GATED_NORM, head_dim=dv)
            walk.linear(out, R)
            walk.mlp(*(_weight(specs[n]) for n in mlp), R)
        walk.prologue(head, R, Prologue.ADD_NORM)
        walk.linear(head, R)
        if mtp:
            walk.linear(_weight(specs["mtp.fc"]), R)

    if c.linear_layers:
        Hk, Hv, dk = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim
        K, P = c.linear_conv_kernel_dim, tuning.deltanet_step_blocks
        walk.add("gdn.cu", SCAN)
        if mtp:  # a drafting verify keeps its rows' states
            walk.add("gdn.cu", SCAN_KEEP)
            keep_step = keep_step_kernel(Hk, Hv, dk, dv, K, P, card.capability)
            if keep_step is not None:
                walk.add("gdn.cu", keep_step[0])
        step = step_kernel(Hk, Hv, dk, dv, K, P, card.capability)
        if step is not None:
            walk.add("gdn.cu", step[0])
        chunk = chunk_kernel(dtype, card.capability, card.smem_per_block)
        if chunk is not None and dv % 32 == 0:
            walk.add(chunk.file, chunk.symbol)
    if c.full_layers:
        Hkv, hd = c.num_key_value_heads, c.head_dim
        group = c.num_attention_heads // Hkv
        for splits in range(1, ATTN_SPLITS + 1):
            for R in (1, MANY_STREAMS):
                for inv in (False, True) if invariant is None else (invariant,):
                    args = (group, hd, splits, Hkv, R, card.sm_count, inv)
                    sym, _ = decode_kernel(*args, q8=kv_cache == "int8")  # EngineSettings.kv_cache
                    walk.add("attention.cu", sym)
        fused, _ = prefill_kernel(hd, dtype, card.capability, card.smem_per_block)
        if fused:
            walk.add("attn_prefill.cu", fused)
    return walk.modules()


def requests(mods: list[Module]) -> frozenset[tuple[str, str]]:
    """Every (file, kernel) the modules hold: their name expressions and each file's extern
    "C" kernels (what launch.Kernels checks a request against)."""
    out = {(m.file, n) for m in mods for n in m.names}
    out |= {(m.file, n) for m in mods for n in extern_kernels(m.file)}
    return frozenset(out)
