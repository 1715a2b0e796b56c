"""The decision's speed prediction: calibrated on the H200, scaled to other cards."""

from __future__ import annotations

from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs
from engine.memory.speed import REFERENCE_CARDS, CardSpeed, card_speed


def _decide(card_gib, speed, context=16384, fused=False, **kw):
    config = shape_config("4B", "mlx4")
    size = int(card_gib * GIB)
    card = Card(total=size, free=size, speed=speed, fused_attention=fused)
    specs = shape_tensor_specs(config, "mlx4")
    return decide(specs, config, EngineSettings(), card, context=context, **kw)


def test_the_calibration_card_gets_back_what_it_measured():
    """Fitted to the 4B's 689 tokens/s, 0.418 s for 8,000 prompt tokens and 1.194 s for
    16,000 on the H200 (tools/bench_small_card.py at e096918)."""
    p = _decide(140, REFERENCE_CARDS["H200"], context=16000, max_rows=512).prediction
    assert abs(p.decode_tok_s - 689) / 689 < 0.03
    assert abs(p.ttft_s - 1.194) / 1.194 < 0.05
    eight = _decide(140, REFERENCE_CARDS["H200"], context=8000, max_rows=512).prediction
    assert abs(eight.ttft_s - 0.418) / 0.418 < 0.2
    assert "16K prompt" in _decide(140, REFERENCE_CARDS["H200"]).prediction.sentence()
    assert "tokens/s" in p.sentence()


def test_the_tensor_core_prefill_kernels_get_back_what_they_measured():
    """With the fused attention and the TF32 delta rule (tools/bench_small_card.py at
    e6f5b11): 0.337, 0.668 and 1.585 s for 8,000, 16,000 and 32,000 prompt tokens."""
    h200 = REFERENCE_CARDS["H200"]
    for n, measured in ((8000, 0.337), (16000, 0.668), (32000, 1.585)):
        p = _decide(140, h200, context=n, fused=True, max_rows=512).prediction
        assert abs(p.ttft_s - measured) / measured < 0.1, (n, p.ttft_s)
    # In the 2048-row windows the plan widens to on this card (3b189b4): 0.195 and 0.967 s.
    for n, measured in ((8000, 0.195), (32000, 0.967)):
        d = _decide(140, h200, context=n, fused=True)
        assert d.max_rows == 2048
        assert abs(d.prediction.ttft_s - measured) / measured < 0.1, (n, d.prediction.ttft_s)
    # On a laptop card the kernels are bounded by its slower tensor cores, and still faster
    # than the unfused path's fp32 products there.
    laptop = REFERENCE_CARDS["RTX 3050 Laptop 4GB"]
    fused = _decide(4, laptop, context=16384, fused=True).prediction.ttft_s
    assert fused < _decide(4, laptop, context=16384).prediction.ttft_s


def test_each_prefill_term_scales_with_the_resource_that_bounds_it():
    """Doubling a card's tensor, fp32 or memory throughput each shortens the prefill, and
    none alone by half: the calibration card's prompt time is split among them."""
    base = CardSpeed("a card", 400e9, 20e12, 8e12)
    ttft = _decide(8, base, context=8000).prediction.ttft_s
    for faster in (
        CardSpeed("a card", 800e9, 20e12, 8e12),
        CardSpeed("a card", 400e9, 40e12, 8e12),
        CardSpeed("a card", 400e9, 20e12, 16e12),
    ):
        quicker = _decide(8, faster, context=8000).prediction.ttft_s
        assert ttft / 2 < quicker < ttft


def test_smaller_chunks_and_slower_cards_predict_slower():
    h200 = REFERENCE_CARDS["H200"]
    big = _decide(140, h200).prediction
    small_rows = _decide(140, h200, max_rows=64).prediction
    assert small_rows.ttft_s > big.ttft_s and small_rows.decode_tok_s == big.decode_tok_s
    laptop = _decide(4, REFERENCE_CARDS["RTX 3050 Laptop 4GB"]).prediction
    assert laptop.decode_tok_s < big.decode_tok_s / 10 and laptop.ttft_s > big.ttft_s


def test_no_card_speed_no_prediction():
    assert _decide(4, None).prediction is None


def test_card_speed_from_what_nvml_reports():
    """An RTX 4060: sm_89, 3072 CUDA cores (24 SMs), 2.46 GHz, 272 GB/s."""
    s = card_speed("RTX 4060", 89, 3072, 2.46e9, 272e9)
    assert s.tensor_flops == REFERENCE_CARDS["RTX 4060 8GB"].tensor_flops
    assert s.fp32_flops == REFERENCE_CARDS["RTX 4060 8GB"].fp32_flops


def test_the_sentence_reads_as_said():
    """ "an 8K prompt", "an 18,688-token prompt", "a 16K prompt"."""
    from engine.memory.speed import Prediction

    def said(n: int) -> str:
        return Prediction("a card", n, 1.0, 100.0).sentence().split(" prompt")[0]

    assert said(8192) == "an 8K" and said(16384) == "a 16K" and said(11 * 1024) == "an 11K"
    assert said(18688) == "an 18,688-token" and said(1800) == "a 1,800-token"
