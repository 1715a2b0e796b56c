"""Which GEMV kernel, variant and launch geometry a decode-sized projection gets: pure
functions of its shape, the activation dtype and the card's properties (no CUDA).

`Projections` (projections.py) decides with these at run time, and catalog.py lists every
kernel instance the backend can request with the same functions. Shared memory is budgeted
per variant: each variant's own block size and its own prologue (none: no norm weight),
with the static bytes gemv4.cu declares, against what one block may opt in to.
"""

from __future__ import annotations

from enum import IntEnum

from engine.backends.cuda.launch import cdiv

GEMV_MAX_ROWS = 8
# SIMT kernel (gemv.cu): (rows per warp, 16-byte chunks in flight per lane and row)
GEMV_VARIANTS = ((1, 4), (2, 4), (4, 2), (4, 4))
GEMV_SWIGLU_VARIANTS = ((2, 4), (2, 2), (2, 8))
# Tensor-core kernel (gemv4.cu): (warps per 16-row tile or 0 = enough for at most `groups`
# groups each, tiles per block, groups per load step, next step prefetched)
GEMV4_VARIANTS = (
    (4, 2, 2, True),
    (8, 1, 4, True),
    (16, 1, 2, True),
    (2, 4, 4, True),
    (32, 1, 2, True),
    (0, 1, 8, False),
    (0, 2, 8, False),
    (0, 4, 8, False),
    (0, 2, 4, False),
)
GEMV4_MAXT = 768  # largest block of the auto-sized variants
# A prologue is recomputed by every block, once: the grid is capped at what the GPU holds
# at once (blocks loop over tiles), so even the LM head's 248,320 rows take one norm per
# resident block, about 500 at the 4B, instead of a separate norm kernel and its boundary.
PRO_MAX_OUT = 1 << 24
PRO_SUMS = 256  # shared-memory slots for the prologue's row (or head) sums


class Prologue(IntEnum):
    """What gemv4 stages as its input: its PRO template argument (gemv4_parts.cuh). In bf16
    the kernel runs ADD_NORM in one pass by itself (its PRO 4)."""

    NONE = 0
    ADD_NORM = 1  # rms_norm(x + delta) * norm, storing x + delta: before every projection
    GATED_NORM = 2  # rms_norm per head(o) * norm * silu(x): the DeltaNet's before out_proj
    GATED_NORM_FOLDED = 5  # GATED_NORM in one pass (bf16, heads a multiple of 64 wide)


def gemv4_threads(cols: int, v: tuple) -> tuple[int, int]:
    """(warps per tile, threads per block) of variant v for rows of `cols` columns."""
    ks, tpb, ug = v[0], v[1], v[2]
    if ks == 0:
        ks = max(1, min(cdiv(cols // 64, ug), GEMV4_MAXT // (32 * tpb)))
    return ks, 32 * ks * tpb


def gemv4_smem(rows: int, cols: int, threads: int, kind: int) -> int:
    """Dynamic shared bytes of gemv4 (gemv4.cu's layout): xs, sx, red; a prologue
    (kind != 0) keeps its norm weight (or gated norm's weight and scales) there too."""
    xs_sx_red = rows * (cols // 8 + 1) * 16 + cols // 64 * 32 + threads * 16
    return xs_sx_red + (cols * 4 if kind else 0)


def gemv4_static_smem(kind: int) -> int:
    """Static shared bytes gemv4.cu declares (pss: 256 floats with a prologue, else 1; invs:
    8): they count against the same per-block limit as the dynamic bytes."""
    return 4 * ((PRO_SUMS if kind else 1) + 8)


def gemv4_variants(rows: int, cols: int, kind: int, smem_per_block: int) -> list[tuple]:
    """The GEMV4_VARIANTS whose shared memory one block may take on this card, each
    budgeted for its own block size and its own prologue (none: no norm weight): on a
    99 KiB card a wide down projection keeps the variants of fewer threads."""
    static = gemv4_static_smem(kind)
    return [
        v
        for v in GEMV4_VARIANTS
        if gemv4_smem(rows, cols, gemv4_threads(cols, v)[1], kind) + static <= smem_per_block
    ]


def gemv4_kind(kind: int, dtype: str, head_dim: int) -> int:
    """The PRO template argument a prologue runs as: the gated norm folds into one pass in
    bf16 where heads are a multiple of 64 wide (each group's sum scaled by its head's norm)."""
    if kind == Prologue.GATED_NORM and dtype == "bfloat16" and head_dim % 64 == 0:
        return Prologue.GATED_NORM_FOLDED
    return kind


def gemv4_symbol(R: int, swiglu: bool, v: tuple, kind: int) -> str:
    """The gemv4 template instance of variant `v` (the kernel's ASYNC staging is unused)."""
    ks, tpb, ug, pipe = v
    maxt = 32 * ks * tpb if ks else GEMV4_MAXT
    sw, pp = ("true" if b else "false" for b in (swiglu, pipe))
    return f"gemv4<{R},{sw},{tpb},{ug},{pp},{maxt},{int(kind)},false>"


def gemv4_module(R: int, swiglu: bool, kind: int) -> list[str]:
    """The instances of one gemv4 module: every variant of (rows, swiglu, prologue)."""
    return [gemv4_symbol(R, swiglu, v, kind) for v in GEMV4_VARIANTS]


def gemv4_blocks(n_out: int, swiglu: bool, tpb: int) -> int:
    """Blocks that cover `n_out` rows in tiles of 16 (SwiGLU: 8 gate and 8 up rows), `tpb`
    tiles a block; the grid is this or what the GPU holds at once, the smaller."""
    return cdiv(cdiv(n_out, 8 if swiglu else 16), tpb)


def simt_symbol(bits: int, R: int, rpw: int, swiglu: bool, u: int) -> str:
    """The SIMT gemv.cu instance (bits 0: dense weights in the activation type)."""
    return f"gemv<{bits},{R},{rpw},{'true' if swiglu else 'false'},{u}>"


def simt_variants(swiglu: bool) -> tuple:
    return GEMV_SWIGLU_VARIANTS if swiglu else GEMV_VARIANTS


def dequant_symbol(bits: int, blocked: bool) -> str:
    """quant.cu's dequantization into the workspace (the prompt path's products)."""
    return f"dequant<{bits},{int(blocked)}>"


# quant.cu's rearrangement into 8-row blocks at load: the codes, then scales and biases.
TO_BLOCKS = ("to_blocks<unsigned,8>", "to_blocks<unsigned short,1>")


def blocked_layout(
    dtype: str, bits: int, group_size: int, cols: int, mma: bool, smem_per_block: int
) -> bool:
    """Whether a quantized matrix is stored in 8-row blocks: where gemv4 reads it (4-bit
    g64, half activations, compute capability 8.0, one row's input fits a block's shared
    memory in some variant) and an 8-row block fits `to_blocks`' (4 bytes a column)."""
    if dtype == "float32" or bits != 4 or group_size != 64 or cols % 64 or not mma:
        return False
    return bool(gemv4_variants(1, cols, Prologue.NONE, smem_per_block)) and (
        4 * cols <= smem_per_block
    )


def gemv_fits(
    rows: int, cols: int, bits: int, blocked: bool, itemsize: int, mma: bool, smem: int
) -> bool:
    """Whether a decode-sized product (no prologue) runs a GEMV kernel: gemv4 for blocked
    matrices, the SIMT kernel for the rest; else it is dequantized for cuBLAS."""
    if rows > GEMV_MAX_ROWS:
        return False
    if bits and blocked:
        return mma and bool(gemv4_variants(rows, cols, Prologue.NONE, smem))
    if bits:
        return (cols * bits) % 128 == 0
    return (cols * itemsize) % 16 == 0


def prologue_fits(
    rows: int,
    cols: int,
    n_out: int,
    kind: int,
    head_dim: int,
    blocked: bool,
    dtype: str,
    mma: bool,
    smem: int,
    invariant: bool = False,
) -> bool:
    """Whether gemv4 runs this product with prologue `kind` (the shapes' part of `pro_ok`;
    the input's alignment is the other). `invariant` (batch-invariant mode): the add + norm
    only where gemv4 sums each row's squares in the same order at any batch size (bf16's
    one pass, compiled with SNUG_BATCH_INVARIANT: one slot per 256 columns a row); fp16's
    two passes add one sum a warp, and which entries a warp takes follows the batch size,
    so that norm runs as its own kernel there."""
    if rows > GEMV_MAX_ROWS or dtype == "float32" or not blocked or not mma:
        return False
    if invariant and kind == Prologue.ADD_NORM:
        if dtype != "bfloat16" or cols % 256 or rows * (cols // 256) > PRO_SUMS:
            return False
    if not gemv4_variants(rows, cols, gemv4_kind(kind, dtype, head_dim), smem):
        return False
    if kind == Prologue.ADD_NORM:
        return n_out <= PRO_MAX_OUT and rows <= PRO_SUMS
    seg = head_dim // 8
    return (
        head_dim % 8 == 0
        and 0 < seg <= 32
        and seg & (seg - 1) == 0
        and cols % head_dim == 0
        and rows * (cols // head_dim) <= PRO_SUMS
    )


# ----- batch-invariant decode ----------------------------------------------------------------
# In this mode (EngineSettings.batch_invariant) a row's products are summed in the same order
# at every batch size: each launch takes a variant of the order its one-row launch has, and
# the decode kernels' fits are judged at one row (Projections.gemv).


def reduction_order(choice: tuple, cols: int) -> tuple:
    """What fixes the order in which a decode projection sums each output row, for a choice
    as `Projections.gemv_candidates` names it. gemv4: the warps that share a tile; each sums
    a contiguous slice of the column groups in ascending order and the slices are added in
    warp order, while tiles per block, groups per load step, prefetching and the rows beside
    it change nothing of a row's sums (each tensor-core output element is its own row of the
    weights times its own activation row). The SIMT kernel sums a row the same way in every
    variant: each lane its 16-byte chunks in ascending order, then one warp sum."""
    if choice[0] == "mma":
        return ("mma", gemv4_threads(cols, tuple(choice[1:]))[0])
    if choice[0] == "tc":  # gemv_tc: its warps' column slices, added in warp order
        return tuple(choice)
    return (choice[0],)


def order_candidates(cands: list, cols: int, order: tuple) -> list:
    """The candidates whose rows are summed in `order`."""
    return [c for c in cands if reduction_order(c, cols) == order]


def invariant_rows(
    rows: int, cols: int, order: tuple, kind: int, heads: int, smem_per_block: int
) -> int:
    """Batch-invariant mode: the rows one launch takes, the most (up to `rows` and
    GEMV_MAX_ROWS) at which a gemv4 variant of `order` fits one block's shared memory and
    the prologue's sums fit their PRO_SUMS slots (`kind`, the PRO template argument: the add
    + norm takes one a 256 columns a row, the gated norm one a head a row). More rows than
    that run as several launches, each row as it runs alone."""
    r = min(rows, GEMV_MAX_ROWS)
    if kind == Prologue.ADD_NORM:
        r = min(r, PRO_SUMS // max(1, cols // 256))
    elif kind:
        r = min(r, PRO_SUMS // max(1, heads))
    if order[0] == "mma":
        while r > 1:
            cands = [("mma", *v) for v in gemv4_variants(r, cols, kind, smem_per_block)]
            if order_candidates(cands, cols, order):
                break
            r -= 1
    return max(1, r)
