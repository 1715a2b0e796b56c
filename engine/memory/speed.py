"""What speed a plan will give: a cost model of prefill and decode, calibrated on a GPU.

Admission decides what fits; this module says how fast the result will be, so a decision
can carry "a 16K prompt: about 1.4 s to the first token; about 650 tokens/s" (invariant 8:
the decision predicts the speed it will give). Each term is scaled from the card the
coefficients were measured on to the card at hand by the resource that bounds it:

    decode step   = layers * step_layer_s  +  bytes read per step / (bandwidth * bw_eff)
    prefill of P  = P * flops/token / (tensor * mm_eff)         projections (cuBLAS)
                  + attention flops(P) / mma(attn_tc_issue)     quadratic in P: the fused
                                                                attention (attn_prefill)
                  + P * DeltaNet work/token / mma(gdn_tc_issue) the chunked delta rule on
                                                                TF32 tensor cores
                  + P * DeltaNet work/token / (fp32 * other_eff)
                                                                the other per-token kernels
                  + chunks * (dense + packed weight bytes) / (bandwidth * deq_eff)
                                                                a quantized checkpoint's
                                                                weights dequantized per chunk
                  + chunks * layers * chunk_layer_s             the host's launches

where mma(issue) = min(tensor * tc_share, fp32 * issue): those two kernels issue their
tensor-core instructions from few warps an SM, so on the H200 they reach a small share of
its tensor throughput, bounded by the SMs' issue (SMs x clock, which the fp32 throughput
is proportional to); a card with slow tensor cores is bounded by them instead. That is a
card that runs the tensor-core prefill kernels (16-bit activations from sm_80:
`Card.fused_attention`). Elsewhere attention computes its scores and an fp32 softmax in the
workspace (attention flops / (fp32 * attn_eff)) and the delta rule and the other kernels
run on fp32 SIMT lanes (P * work / (fp32 * simt_eff)), as calibrated before those kernels.

Bytes read per step are the weights on the card (an embedding table only where it is also
the LM head) plus the KV cache at the context. The prefill terms were split by a trace of
an 8K prompt through `Engine.generate` (tools/profile_prefill.py: cuBLAS, fp32 kernels,
dequantization, gaps) and fitted with the 8K and 16K prompts' measured times; the tensor
terms of the two prefill kernels by their device tests' timings and the 8K, 16K and 32K
prompts measured with them; the decode terms by `tools/bench_small_card.py`. `CALIBRATION`
says which run. A card's bandwidth and throughputs come from NVML (`card_speed`), or from
`REFERENCE_CARDS` by name for planning without one. Scaling the whole prefill by tensor
throughput alone made a laptop card look several times slower than it is: on the
calibration card most of a prompt's time is the other kernels, the dequantization's memory
traffic and launches, not tensor work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.model_config import ModelConfig


@dataclass(frozen=True)
class CardSpeed:
    """What bounds a phase on a card: memory bandwidth and dense bf16 tensor throughput
    (fp32 accumulation, as the engine's kernels use)."""

    name: str
    bandwidth: float  # bytes/s
    tensor_flops: float  # flop/s
    simt_flops: float = 0.0  # fp32 flop/s of the CUDA cores (0: not known, taken as tensor/8)

    @property
    def fp32_flops(self) -> float:
        return self.simt_flops or self.tensor_flops / 8


@dataclass(frozen=True)
class Calibration:
    """Efficiencies measured on one card (`card`), through the app's path."""

    card: CardSpeed
    step_layer_s: float  # fixed cost of one layer of a decode step (launches, waits)
    bw_eff: float  # share of the bandwidth a decode step's weight reads reach
    mm_eff: float  # share of the tensor throughput prefill projections reach
    attn_eff: float  # share of the fp32 throughput unfused prefill attention reaches
    simt_eff: float  # share of the fp32 throughput the DeltaNet work unit reaches on SIMT
    attn_tc_issue: float  # fused attention flops a second per fp32 flop a second (mma)
    gdn_tc_issue: float  # TF32 delta rule work a second per fp32 flop a second (mma)
    tc_share: float  # share of the tensor throughput those two reach where it bounds them
    other_eff: float  # share of the fp32 throughput the other per-token kernels reach
    deq_eff: float  # share of the bandwidth a chunk's dequantization reaches
    chunk_layer_s: float  # host time one layer of a prefill chunk costs (its launches)
    source: str  # the run the numbers come from


@dataclass(frozen=True)
class Prediction:
    """What a decision will give: the first token of a prompt that fills the context, and
    the decode rate of one stream at the start of its reply."""

    card: str
    prompt_tokens: int
    ttft_s: float
    decode_tok_s: float

    def sentence(self) -> str:
        size = _tokens(self.prompt_tokens)
        return (
            f"{_article(size)} {size} prompt: about {_seconds(self.ttft_s)} to the "
            f"first token; about {_rate(self.decode_tok_s)} tokens/s (predicted for "
            f"{self.card})"
        )


# Dense bf16 tensor flop per clock per SM with fp32 accumulation, by compute capability
# (GeForce parts accumulate in fp32 at half their fp16 rate; data-centre parts do not).
_TENSOR_FLOP_PER_CLOCK = {75: 512, 80: 2048, 86: 512, 87: 512, 89: 512, 90: 4096, 120: 512}
_CORES_PER_SM = {75: 64, 80: 64, 86: 128, 87: 128, 89: 128, 90: 128, 120: 128}

REFERENCE_CARDS = {
    "H200": CardSpeed("an H200", 4.8e12, 989e12, 16896 * 2 * 1.98e9),
    "RTX 3050 Laptop 4GB": CardSpeed(
        "an RTX 3050 Laptop (4 GB)", 192e9, 16 * 512 * 1.5e9, 2048 * 2 * 1.5e9
    ),
    "RTX 3060 12GB": CardSpeed("an RTX 3060 (12 GB)", 360e9, 28 * 512 * 1.78e9, 3584 * 2 * 1.78e9),
    "RTX 4060 8GB": CardSpeed("an RTX 4060 (8 GB)", 272e9, 24 * 512 * 2.46e9, 3072 * 2 * 2.46e9),
}
DEFAULT_SMALL_CARD = "RTX 3050 Laptop 4GB"

# Fitted to the H200 figures of the Qwen3.5 4B MLX 4-bit through Engine.generate at
# e096918 (docs/benchmarks.md): decode 689 tokens/s at a short context; an 8,000-token
# prompt 0.418 s, split by its trace into projections 78 ms, fp32 kernels 198 ms,
# dequantization 57 ms (16 chunks) and 54 ms with no kernel running; 16,000 tokens 1.194 s
# (attention takes the rest). The 9B's 499 tokens/s fits the decode terms too. With the
# tensor-core prefill kernels (e6f5b11): gdn_chunk_tc 0.073 ms a 512-row launch of the
# 4B's shape (27 ms an 8,000-token prompt), the fused attention about 0.49 s of a
# 32,000-token prompt (its per-window timings), and the prompts' measured 0.337, 0.668
# and 1.585 s at 8,000, 16,000 and 32,000 tokens in 512-row windows. In 2048-row windows
# (3b189b4) 8,000 and 32,000 tokens took 0.195 and 0.967 s: each window saved cost about
# 12.5 ms at both lengths (its dequantization, launches, and the attention's partly idle
# last wave), which the per-window term now carries, leaving less to the kernels.
CALIBRATION = Calibration(
    card=REFERENCE_CARDS["H200"],
    step_layer_s=25.6e-6,
    bw_eff=0.785,
    mm_eff=0.740,
    attn_eff=0.48,
    simt_eff=0.2,
    attn_tc_issue=3.0,
    gdn_tc_issue=0.439,
    tc_share=0.5,
    other_eff=0.8,
    deq_eff=0.536,
    chunk_layer_s=250e-6,
    source="tools/bench_small_card.py and tools/profile_prefill.py on an H200 (docs/benchmarks.md)",
)


def card_speed(name: str, cc: int, cores: int, sm_clock_hz: float, bandwidth: float) -> CardSpeed:
    """A card's speed from what NVML reports (compute capability as 86, CUDA cores, the
    SM clock, the memory bandwidth)."""
    sms = cores // _CORES_PER_SM.get(cc, 128)
    per_clock = _TENSOR_FLOP_PER_CLOCK.get(cc, 512)
    return CardSpeed(
        name, bandwidth, max(sms, 1) * per_clock * sm_clock_hz, cores * 2 * sm_clock_hz
    )


def step_bytes(config: ModelConfig, weights_on_card: int, embedding: int, context: int) -> int:
    """Bytes one decode step reads: the weights on the card (less a table that is not also
    the head: only a row of it is read), and the KV cache at `context` tokens."""
    read = weights_on_card - (0 if config.tie_word_embeddings else embedding)
    kv = 2 * len(config.full_layers) * config.num_key_value_heads * config.head_dim * 2
    return read + kv * context


def _flops_per_token(config: ModelConfig) -> float:
    """Projection flops of one prompt token (2 per multiply-add), the LM head excluded:
    a prompt computes logits for its last row only."""
    from engine.memory.shapes import layer_linear_shapes

    return 2.0 * sum(out * inp for _name, out, inp in layer_linear_shapes(config))


def _deltanet_work(config: ModelConfig) -> float:
    """The DeltaNet's fp32 work unit of one prompt token: 8 * value heads * key dim * value
    dim per linear-attention layer (the chunked delta rule's products with the state)."""
    linear = config.num_hidden_layers - len(config.full_layers)
    per_layer = 8.0 * config.linear_num_value_heads * config.linear_key_head_dim
    return linear * per_layer * config.linear_value_head_dim


def _attention_flops(config: ModelConfig, prompt: int) -> float:
    """Causal attention of a prompt: QK^T and PV over half the square, per query head."""
    heads = config.num_attention_heads * config.head_dim
    return 2.0 * 2.0 * len(config.full_layers) * heads * prompt * prompt / 2


def predict(
    config: ModelConfig,
    weights_on_card: int,
    embedding: int,
    context: int,
    chunk_rows: int,
    card: CardSpeed,
    cal: Calibration = CALIBRATION,
    tensor_prefill: bool = True,
) -> Prediction:
    """The speed of a plan: TTFT of a prompt that fills `context`, decode at its start.
    `tensor_prefill`: the card runs the tensor-core prefill kernels (module docstring)."""
    bw = card.bandwidth * cal.bw_eff
    layers = config.num_hidden_layers
    step = layers * cal.step_layer_s + step_bytes(config, weights_on_card, embedding, 0) / bw
    chunks = math.ceil(context / max(chunk_rows, 1))
    dense = _flops_per_token(config)  # the projections' bf16 bytes (2 flops a weight)
    packed = max(weights_on_card - embedding, 0)
    dequant = dense + packed if packed < 0.9 * dense else 0.0  # only a quantized checkpoint
    attention, work = _attention_flops(config, context), context * _deltanet_work(config)
    if tensor_prefill:
        cap = card.tensor_flops * cal.tc_share
        kernels = (
            attention / min(cap, card.fp32_flops * cal.attn_tc_issue)
            + work / min(cap, card.fp32_flops * cal.gdn_tc_issue)
            + work / (card.fp32_flops * cal.other_eff)
        )
    else:
        kernels = attention / (card.fp32_flops * cal.attn_eff) + work / (
            card.fp32_flops * cal.simt_eff
        )
    prefill = (
        context * dense / (card.tensor_flops * cal.mm_eff)
        + kernels
        + chunks * (dequant / (card.bandwidth * cal.deq_eff) + layers * cal.chunk_layer_s)
    )
    return Prediction(card.name, context, prefill, 1.0 / step)


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else f"{n:,}-token"


def _article(size: str) -> str:
    """ "an" where the number is said starting with a vowel (8K: eight; 18,432: eighteen
    thousand; 11K: eleven), else "a"."""
    lead = size.split(",")[0].rstrip("K-token")
    return "an" if lead.startswith("8") or lead in ("11", "18") else "a"


def _seconds(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.1f} s"


def _rate(r: float) -> str:
    return f"{r:,.0f}" if r >= 100 else f"{r:.0f}"
