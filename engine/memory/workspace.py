"""The prompt workspace: room for the two prompt-sized jobs that do not fit the scratch.

1. Projections on quantized weights: a prefill chunk dequantizes one layer projection at a
   time into a tile and runs a dense GEMM, so the tile holds the largest layer projection
   (out x in, compute dtype). The embedding and the head never go through it.
2. Prefill attention: scores (fp32) and probabilities (compute dtype) of a group of query
   rows against every key of the stream so far, `Hq x q_rows x context`, with q_rows at most
   ATTN_QUERY_ROWS; the attention kernel takes as many query rows per pass as fit. With the
   8-bit KV cache, one KV head's keys and values dequantized for cuBLAS come first
   (`kv [2,T,hd] dt`), and the scores of that head's query heads follow them. Where prefill
   attention runs fused (`score_rows_for`: 16-bit activations on a tensor-core card, the
   CUDA backend's attn_prefill) it writes no scores: q_rows is 0 and only the 8-bit cache's
   dequantized head remains.

The two never run at once, so the block is the larger of the two:

    +-- tile [max out * max in] dt  |or|  (kv) scores [Hq,q,T] f32 + probs [Hq,q,T] dt --+

It grows on demand like the scratch (`engine.memory.growth`); a failed grow raises
WorkspaceGrowFailed and keeps the old block.
"""

from __future__ import annotations

from typing import Any

from engine.config import KV_CACHES
from engine.errors import WorkspaceGrowFailed
from engine.memory.growth import GrowableBuffer
from engine.memory.pool import Allocation, DevicePool
from engine.memory.scratch import DTYPE_NAMES, align_up
from engine.memory.shapes import layer_linear_shapes
from engine.model_config import ModelConfig

ATTN_QUERY_ROWS = 16  # the least: what a small card gives prefill attention
FAST_QUERY_ROWS = 256  # what admission gives it when the card has room (fewer, larger passes)
FUSED_HEAD_DIMS = (64, 128, 256)  # the head sizes the fused prefill attention has instances for


def score_rows_for(fused_attention: bool, config: ModelConfig, dtype_bytes: int) -> int:
    """Query rows of scores the workspace holds: none where the card runs the fused prefill
    attention for this model and activation size (16-bit, a head size it covers), else
    ATTN_QUERY_ROWS (admission may raise it to FAST_QUERY_ROWS)."""
    if fused_attention and dtype_bytes == 2 and config.head_dim in FUSED_HEAD_DIMS:
        return 0
    return ATTN_QUERY_ROWS


def _tile_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """The largest layer projection dequantized (0 when the weights are not quantized)."""
    if not config.quantized:
        return 0
    return max(out * inp for _, out, inp in layer_linear_shapes(config)) * dtype_bytes


def attention_scores_bytes(
    config: ModelConfig, query_rows: int, context: int, dtype_bytes: int = 2
) -> int:
    """Scores and probabilities of `query_rows` query rows against `context` keys."""
    return config.num_attention_heads * query_rows * context * (4 + dtype_bytes)


def kv_dequant_bytes(config: ModelConfig, context: int, dtype_bytes: int, kv_cache: str) -> int:
    """The 8-bit cache's keys and values of one KV head at `context`, dequantized for the
    prompt's products (0 for the cache in the compute dtype, which cuBLAS reads in place)."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache {kv_cache!r}: choose {' or '.join(KV_CACHES)}")
    if kv_cache != "int8" or not config.full_layers:
        return 0
    return 2 * align_up(context * config.head_dim * dtype_bytes)


def workspace_bytes(
    config: ModelConfig,
    rows: int,
    dtype_bytes: int = 2,
    context: int = 4096,
    score_rows: int = ATTN_QUERY_ROWS,
    kv_cache: str = "bf16",
) -> int:
    """Workspace size for prefill chunks of `rows` rows at `context` tokens, with room for
    the attention scores of `score_rows` query rows at once (and, with the 8-bit KV cache,
    a KV head's keys and values dequantized)."""
    if rows <= 0:
        return 0
    scores = attention_scores_bytes(config, min(rows, score_rows), context, dtype_bytes)
    scores += kv_dequant_bytes(config, context, dtype_bytes, kv_cache)
    return align_up(max(_tile_bytes(config, dtype_bytes), scores))


class Workspace(GrowableBuffer):
    """The live workspace block; `ensure(rows)` before a prefill chunk of `rows` rows."""

    tag = "workspace"
    error = WorkspaceGrowFailed

    def __init__(
        self,
        pool: DevicePool,
        config: ModelConfig,
        dtype_bytes: int,
        max_rows: int,
        context: int = 4096,
        score_rows: int = ATTN_QUERY_ROWS,
        kv_cache: str = "bf16",
    ) -> None:
        super().__init__(pool, max_rows)
        self.config = config
        self.dtype_bytes = dtype_bytes
        self.context = context
        self.score_rows = score_rows
        self.kv_cache = kv_cache

    def size_for(self, rows: int) -> int:
        c, dt = self.config, self.dtype_bytes
        return workspace_bytes(c, rows, dt, self.context, self.score_rows, self.kv_cache)

    def _carve(self, block: Allocation, rows: int) -> dict[str, Any]:
        dt = DTYPE_NAMES[self.dtype_bytes]
        return {"tile": block.view(0, (block.nbytes // self.dtype_bytes,), dt)}
