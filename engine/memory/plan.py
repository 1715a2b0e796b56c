"""Plan: what a model needs on the card, in bytes, before anything is allocated.

A `Plan` is a frozen value computed from a checkpoint's stored tensor sizes and the model's
shape. It allocates nothing and reads no device; `engine.memory.admission` decides from it
what fits, and the session commits (allocates) what the decision says.

Per stream, at context T (dt = compute dtype bytes):

    KV         = 2 * n_full_layers * Hkv * hd * T * dt          (kv_cache "bf16")
               = 2 * n_full_layers * Hkv * (hd + 4) * T         (kv_cache "int8": codes and
                                                                 an fp32 scale per token/head)
    conv       = n_linear_layers * C * (K - 1) * dt
    recurrent  = n_linear_layers * Hv * dk * dv * 4      (fp32 always)

Drafting k tokens a step with the MTP head (engine.memory.draft) adds, per stream:

    mtp KV     = 2 * Hkv * hd * T * dt    (its one full-attention layer, stored as the KV)
    verify     = n_linear_layers * (k * Hv * dk * dv * 4 + (K + k) * C * dt)
                 (the DeltaNet states a verify of k + 1 rows keeps to roll back exactly)

The prompt cache holds `prompt_cache_states` saved stream states of the same size (less
the verify rows, which a saved state does not hold).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from engine.config import KV_CACHES
from engine.memory.growth import growth_peak
from engine.memory.scratch import scratch_bytes
from engine.memory.workspace import ATTN_QUERY_ROWS, workspace_bytes
from engine.model_config import ModelConfig

EMBEDDING = "embed_tokens"
HEAD = "lm_head"
KV_SCALE_BYTES = 4  # the 8-bit cache's fp32 scale per token, KV head and K or V


def kv_row_bytes(head_dim: int, kv_cache: str, dtype_bytes: int) -> int:
    """Bytes of one token's key (or value) of one KV head in the cache: `head_dim` values in
    the compute dtype, or in int8 with their scale (engine/backends/kv_int8.py)."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache {kv_cache!r}: choose {' or '.join(KV_CACHES)}")
    return head_dim + KV_SCALE_BYTES if kv_cache == "int8" else head_dim * dtype_bytes


@dataclass(frozen=True)
class WeightBytes:
    """Stored weight bytes split by where they may live.

    arena: every tensor the forward needs on the card: all but the embedding table and
    `mtp.*` (an untied `lm_head` is here). embedding: `embed_tokens`. When tied, the table is
    also the head, so it must be on the card and needs no separate lookup copy; when untied it
    is only read a few rows per forward and may live in pinned host memory (invariant 7).
    mtp: the multi-token-prediction head, on the card only where `mtp_loaded` (drafting).
    """

    arena: int
    embedding: int
    tied: bool
    mtp: int = 0
    mtp_loaded: bool = False

    @classmethod
    def from_tensors(
        cls, tensor_nbytes: Mapping[str, int], config: ModelConfig, mtp_loaded: bool = False
    ) -> WeightBytes:
        if EMBEDDING not in tensor_nbytes:
            raise ValueError(f"{config.source}: the checkpoint has no {EMBEDDING!r} tensor")
        tied = config.tie_word_embeddings or HEAD not in tensor_nbytes
        mtp = sum(n for k, n in tensor_nbytes.items() if k.startswith("mtp."))
        arena = sum(
            n for k, n in tensor_nbytes.items() if k != EMBEDDING and not k.startswith("mtp.")
        )
        embedding = tensor_nbytes[EMBEDDING]
        return cls(arena=arena, embedding=embedding, tied=tied, mtp=mtp, mtp_loaded=mtp_loaded)

    @property
    def required_on_card(self) -> int:
        """Bytes that must be on the card whatever the plan (the arena, plus a tied table,
        plus the MTP head when it drafts)."""
        mtp = self.mtp if self.mtp_loaded else 0
        return self.arena + mtp + (self.embedding if self.tied else 0)

    @property
    def movable_to_host(self) -> int:
        """Bytes that may live in host memory instead (an untied embedding table)."""
        return 0 if self.tied else self.embedding


@dataclass(frozen=True)
class StateBytes:
    """One stream's state at the plan's context."""

    kv: int
    conv: int
    recurrent: int
    mtp_kv: int = 0  # the MTP head's KV cache (drafting)
    verify: int = 0  # what a verify keeps to roll back (drafting; not in a saved state)

    @property
    def total(self) -> int:
        return self.kv + self.conv + self.recurrent + self.mtp_kv + self.verify

    @property
    def saved(self) -> int:
        """What a saved state (the prompt cache) holds: all but the verify rows."""
        return self.total - self.verify


def stream_state_bytes(
    config: ModelConfig,
    context: int,
    dtype_bytes: int = 2,
    kv_cache: str = "bf16",
    draft_tokens: int = 0,
) -> StateBytes:
    """KV of the full-attention layers at `context` (in the compute dtype, or 8-bit with
    `kv_cache` "int8"), plus DeltaNet conv and fp32 recurrent state; with `draft_tokens`,
    the MTP head's KV and the verify's rows (module docstring)."""
    c = config
    n_full, n_lin = len(c.full_layers), len(c.linear_layers)
    row = kv_row_bytes(c.head_dim, kv_cache, dtype_bytes)
    kv = 2 * n_full * c.num_key_value_heads * row * context
    conv = n_lin * c.conv_dim * (c.linear_conv_kernel_dim - 1) * dtype_bytes
    rec = n_lin * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    if not draft_tokens:
        return StateBytes(kv=kv, conv=conv, recurrent=rec)
    mtp_kv = 2 * c.num_key_value_heads * row * context
    history = n_lin * c.conv_dim * (c.linear_conv_kernel_dim + draft_tokens) * dtype_bytes
    verify = draft_tokens * rec + history
    return StateBytes(kv=kv, conv=conv, recurrent=rec, mtp_kv=mtp_kv, verify=verify)


@dataclass(frozen=True)
class Plan:
    """Everything a model would take on the card for one choice of context, streams, rows.

    scratch_bytes / workspace_bytes: the blocks at max_rows (held whole when allocated at
    warm-up). scratch_peak_bytes / workspace_peak_bytes: the most held at once when they
    instead start empty and grow on demand (old and new together during the last grow).
    """

    config: ModelConfig
    weights: WeightBytes
    context: int
    streams: int
    max_rows: int
    dtype_bytes: int
    prompt_cache_states: int
    state: StateBytes
    scratch_bytes: int
    scratch_peak_bytes: int
    workspace_bytes: int
    workspace_peak_bytes: int
    score_rows: int = ATTN_QUERY_ROWS  # query rows of prefill attention per pass
    kv_cache: str = "bf16"  # the KV cache's storage (EngineSettings.kv_cache)
    draft_tokens: int = 0  # the most tokens a step drafts with the MTP head (0: none)

    @property
    def stream_state_total(self) -> int:
        return self.streams * self.state.total

    @property
    def prompt_cache_bytes(self) -> int:
        return self.prompt_cache_states * self.state.saved

    def resized(
        self,
        context: int | None = None,
        streams: int | None = None,
        max_rows: int | None = None,
        prompt_cache_states: int | None = None,
        score_rows: int | None = None,
    ) -> Plan:
        """The same model with other choices (a prompt cache tied to streams follows them)."""
        new_streams = self.streams if streams is None else streams
        cache = prompt_cache_states
        if cache is None:
            cache = (
                new_streams
                if self.prompt_cache_states == self.streams
                else self.prompt_cache_states
            )
        return make_plan(
            self.weights,
            self.config,
            context=self.context if context is None else context,
            streams=new_streams,
            max_rows=self.max_rows if max_rows is None else max_rows,
            dtype_bytes=self.dtype_bytes,
            prompt_cache_states=cache,
            score_rows=self.score_rows if score_rows is None else score_rows,
            kv_cache=self.kv_cache,
            draft_tokens=self.draft_tokens,
        )

    def with_weights(self, weights: WeightBytes, config: ModelConfig) -> Plan:
        """The same choices for other weights (for example the 4-bit build of this model)."""
        return replace(self, weights=weights, config=config).resized()

    def with_kv_cache(self, kv_cache: str) -> Plan:
        """The same choices with the KV cache stored another way ("bf16" or "int8")."""
        return replace(self, kv_cache=kv_cache).resized()

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "config"}
        out["model"] = self.config.source
        out["stream_state_total"] = self.stream_state_total
        out["prompt_cache_bytes"] = self.prompt_cache_bytes
        return out


def verify_step_rows(streams: int, draft_tokens: int) -> int:
    """The most rows a decode-shaped forward takes: a step's (one a stream), or a drafting
    verify's (draft_tokens + 1, its attention row by row and every row's logits)."""
    return max(streams, draft_tokens + 1 if draft_tokens else 0)


def make_plan(
    weights: WeightBytes | Mapping[str, int],
    config: ModelConfig,
    context: int,
    streams: int = 1,
    max_rows: int = 512,
    dtype_bytes: int = 2,
    prompt_cache_states: int | None = None,
    score_rows: int = ATTN_QUERY_ROWS,
    kv_cache: str = "bf16",
    draft_tokens: int = 0,
) -> Plan:
    """Compute a Plan. `weights` is a WeightBytes or a mapping internal name -> stored nbytes.

    prompt_cache_states: saved stream states kept for resumed chats (None: one per stream).
    kv_cache: "bf16" (the compute dtype) or "int8" (8-bit codes and scales; prefill
    attention then also dequantizes one KV head's keys and values into the workspace).
    draft_tokens: the most tokens a step drafts with the MTP head (its weights belong in
    `weights`, engine.memory.draft); a verify is a window of draft_tokens + 1 rows.
    """
    if context <= 0 or streams <= 0 or max_rows <= 0:
        raise ValueError(
            f"context ({context}), streams ({streams}) and max rows ({max_rows}) must be positive"
        )
    if not isinstance(weights, WeightBytes):
        weights = WeightBytes.from_tensors(weights, config)
    cache = streams if prompt_cache_states is None else prompt_cache_states
    if cache < 0:
        raise ValueError(f"prompt_cache_states = {cache} must not be negative")

    step_rows = verify_step_rows(streams, draft_tokens)

    def scratch(rows: int) -> int:
        return scratch_bytes(config, rows, dtype_bytes, step_rows=step_rows, context=context)

    def work(rows: int) -> int:
        return workspace_bytes(config, rows, dtype_bytes, context, score_rows, kv_cache)

    return Plan(
        config=config,
        weights=weights,
        context=context,
        streams=streams,
        max_rows=max_rows,
        dtype_bytes=dtype_bytes,
        prompt_cache_states=cache,
        state=stream_state_bytes(config, context, dtype_bytes, kv_cache, draft_tokens),
        scratch_bytes=scratch(max_rows),
        scratch_peak_bytes=growth_peak(scratch, 0, max_rows),
        workspace_bytes=work(max_rows),
        workspace_peak_bytes=growth_peak(work, 0, max_rows),
        score_rows=score_rows,
        kv_cache=kv_cache,
        draft_tokens=draft_tokens,
    )
