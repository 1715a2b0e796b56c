"""Plan: what a model needs on the card, in bytes, before anything is allocated.

A `Plan` is a frozen value computed from a checkpoint's stored tensor sizes and the model's
shape. It allocates nothing and reads no device; `engine.memory.admission` decides from it
what fits, and the session commits (allocates) what the decision says.

Per stream, at context T (dt = compute dtype bytes):

    KV         = 2 * n_full_layers * Hkv * hd * T * dt
    conv       = n_linear_layers * C * (K - 1) * dt
    recurrent  = n_linear_layers * Hv * dk * dv * 4      (fp32 always)

The prompt cache holds `prompt_cache_states` saved stream states of the same size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from engine.config import ModelConfig
from engine.memory.growth import growth_peak
from engine.memory.scratch import scratch_bytes
from engine.memory.workspace import ATTN_QUERY_ROWS, workspace_bytes

EMBEDDING = "embed_tokens"
HEAD = "lm_head"


@dataclass(frozen=True)
class WeightBytes:
    """Stored weight bytes split by where they may live.

    arena: every tensor the forward needs on the card: all but the embedding table and
    `mtp.*` (an untied `lm_head` is here). embedding: `embed_tokens`. When tied, the table is
    also the head, so it must be on the card and needs no separate lookup copy; when untied it
    is only read a few rows per forward and may live in pinned host memory (invariant 7).
    mtp: the multi-token-prediction head, not loaded.
    """

    arena: int
    embedding: int
    tied: bool
    mtp: int = 0

    @classmethod
    def from_tensors(cls, tensor_nbytes: Mapping[str, int], config: ModelConfig) -> WeightBytes:
        if EMBEDDING not in tensor_nbytes:
            raise ValueError(f"{config.source}: the checkpoint has no {EMBEDDING!r} tensor")
        tied = config.tie_word_embeddings or HEAD not in tensor_nbytes
        mtp = sum(n for k, n in tensor_nbytes.items() if k.startswith("mtp."))
        arena = sum(
            n for k, n in tensor_nbytes.items() if k != EMBEDDING and not k.startswith("mtp.")
        )
        return cls(arena=arena, embedding=tensor_nbytes[EMBEDDING], tied=tied, mtp=mtp)

    @property
    def required_on_card(self) -> int:
        """Bytes that must be on the card whatever the plan (the arena, plus a tied table)."""
        return self.arena + (self.embedding if self.tied else 0)

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

    @property
    def total(self) -> int:
        return self.kv + self.conv + self.recurrent


def stream_state_bytes(config: ModelConfig, context: int, dtype_bytes: int = 2) -> StateBytes:
    """KV of the full-attention layers at `context`, plus DeltaNet conv and fp32 recurrent state."""
    c = config
    n_full, n_lin = len(c.full_layers), len(c.linear_layers)
    kv = 2 * n_full * c.num_key_value_heads * c.head_dim * context * dtype_bytes
    conv = n_lin * c.conv_dim * (c.linear_conv_kernel_dim - 1) * dtype_bytes
    rec = n_lin * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    return StateBytes(kv=kv, conv=conv, recurrent=rec)


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

    @property
    def stream_state_total(self) -> int:
        return self.streams * self.state.total

    @property
    def prompt_cache_bytes(self) -> int:
        return self.prompt_cache_states * self.state.total

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
        )

    def with_weights(self, weights: WeightBytes, config: ModelConfig) -> Plan:
        """The same choices for other weights (for example the 4-bit build of this model)."""
        return replace(self, weights=weights, config=config).resized()

    def to_dict(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "config"}
        out["model"] = self.config.source
        out["stream_state_total"] = self.stream_state_total
        out["prompt_cache_bytes"] = self.prompt_cache_bytes
        return out


def make_plan(
    weights: WeightBytes | Mapping[str, int],
    config: ModelConfig,
    context: int,
    streams: int = 1,
    max_rows: int = 512,
    dtype_bytes: int = 2,
    prompt_cache_states: int | None = None,
    score_rows: int = ATTN_QUERY_ROWS,
) -> Plan:
    """Compute a Plan. `weights` is a WeightBytes or a mapping internal name -> stored nbytes.

    prompt_cache_states: saved stream states kept for resumed chats (None: one per stream).
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

    def scratch(rows: int) -> int:
        return scratch_bytes(config, rows, dtype_bytes, step_rows=streams, context=context)

    def work(rows: int) -> int:
        return workspace_bytes(config, rows, dtype_bytes, context, score_rows)

    return Plan(
        config=config,
        weights=weights,
        context=context,
        streams=streams,
        max_rows=max_rows,
        dtype_bytes=dtype_bytes,
        prompt_cache_states=cache,
        state=stream_state_bytes(config, context, dtype_bytes),
        scratch_bytes=scratch(max_rows),
        scratch_peak_bytes=growth_peak(scratch, 0, max_rows),
        workspace_bytes=work(max_rows),
        workspace_peak_bytes=growth_peak(work, 0, max_rows),
        score_rows=score_rows,
    )
