"""The CUDA backend's tuned values: one frozen value, handed to the kernel families.

Each field holds what measurement on an H200 kept; docs/benchmarks.md's "tried and not kept"
table lists the alternatives that lost and what they gave. A test that needs a reference
path (one block a key head for the DeltaNet step, say) builds a backend with its own
`Tuning`; nothing changes these values at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import ConfigError


@dataclass(frozen=True)
class Tuning:
    # Blocks a key head of the decode step's DeltaNet launch (gdn_step_split, a thread block
    # cluster, where card.runs_cluster_split); 0, or where the head sizes do not split: one.
    deltanet_step_blocks: int = 4
    # Share of the next MLP's gate and up codes that a decode step's DeltaNet and attention
    # launches bring toward L2 (after all of out_proj or o_proj).
    l2_mlp_fraction: float = 0.3
    # At most this share of the card's L2 for each span brought toward it, so that a small
    # L2 is not flushed by one weight (0.5 of an H200's L2 is more than any 0.8B to 9B span).
    l2_span_share: float = 0.5
    # A draw of one row with top-k <= 32 over at least this many logits has DRAW_NB blocks
    # find the row's candidates first (sampling.py, the split draw).
    split_draw_min_vocab: int = 1 << 16

    def __post_init__(self) -> None:
        if self.deltanet_step_blocks < 0:
            raise ConfigError(
                f"Tuning.deltanet_step_blocks = {self.deltanet_step_blocks}: must be 0 or more"
            )
        for name in ("l2_mlp_fraction", "l2_span_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"Tuning.{name} = {value}: must be between 0 and 1")
        if self.split_draw_min_vocab < 1:
            raise ConfigError(
                f"Tuning.split_draw_min_vocab = {self.split_draw_min_vocab}: must be positive"
            )
