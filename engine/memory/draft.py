"""Whether a checkpoint can draft with its MTP head, and what drafting adds to the plan.

Qwen3.5's Hugging Face checkpoints carry a one-layer multi-token-prediction head (`mtp.*`,
engine.checkpoint.names.expected_mtp_tensors). The mlx-community conversions do not:
mlx-lm's `sanitize` drops every `mtp.` key before quantizing, so an MLX checkpoint cannot
draft. `draft_choice` says which case a checkpoint is in, from its tensor specs alone, so
the load panel, `snug plan` and `Engine.load` reach the same answer (and the same bytes).

Drafting `k` tokens a step adds to the plan (engine.memory.plan):

    weights      the 15 mtp.* tensors (the head shares the embedding table and LM head)
    per stream   the MTP layer's KV cache at the context, plus what a verify of k + 1 rows
                 keeps to roll back exactly: the DeltaNet states after each of its first k
                 rows (fp32) and the conv inputs of the window
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.checkpoint.names import expected_mtp_tensors
from engine.config import EngineSettings
from engine.model_config import ModelConfig

MTP = "mtp."


@dataclass(frozen=True)
class DraftChoice:
    """`tokens`: the most tokens a step drafts (0: the model decodes without drafts);
    `auto`: the count is chosen as the reply goes; `reason`: one sentence for the user."""

    tokens: int
    auto: bool
    reason: str

    @property
    def on(self) -> bool:
        return self.tokens > 0


def unavailable_reason(specs: Mapping[str, Any], config: ModelConfig) -> str | None:
    """None when the checkpoint's MTP head is complete, else why drafting is unavailable.
    `specs`: internal name -> what has `.shape` and `.quant` (a checkpoint's tensors)."""
    present = [n for n in specs if n.startswith(MTP)]
    quantized = any(getattr(s, "quant", None) is not None for s in specs.values())
    if not present:
        if quantized:
            return (
                "the checkpoint has no mtp.* tensors: MLX conversions drop them (mlx-lm's "
                "sanitize), so drafting needs the Hugging Face checkpoint"
            )
        return "the checkpoint has no mtp.* tensors (its MTP head was not saved)"
    layers = config.mtp_num_hidden_layers
    if layers != 1:
        return (
            f"config.json declares mtp_num_hidden_layers = {layers}; Snug drafts with the "
            "one-layer MTP head Qwen3.5 ships"
        )
    for name, shape in expected_mtp_tensors(config).items():
        if name not in specs:
            return f"the MTP head is incomplete: {name} is missing"
        if tuple(specs[name].shape) != shape:
            return (
                f"the MTP head does not match config.json: {name} has shape "
                f"{list(specs[name].shape)}, expected {list(shape)}"
            )
    return None


def draft_choice(
    specs: Mapping[str, Any], config: ModelConfig, settings: EngineSettings
) -> DraftChoice:
    """What `settings.draft_tokens` gives for this checkpoint (why it cannot draft is said
    whatever the setting, so the load panel tells before anyone asks)."""
    why = unavailable_reason(specs, config)
    if why is not None:
        return DraftChoice(0, False, f"drafting is unavailable: {why}")
    k, auto = settings.draft_max, settings.draft_tokens == "auto"
    if not k:
        return DraftChoice(0, False, "drafting is off (the draft tokens setting)")
    if auto:
        return DraftChoice(k, True, f"drafts up to {k} tokens a step with the MTP head (auto)")
    return DraftChoice(k, False, f"drafts {k} token{'s' if k > 1 else ''} a step with the MTP head")
