"""The decision's speed prediction: calibrated on the H200, scaled to other cards."""

from __future__ import annotations

from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs
from engine.memory.speed import REFERENCE_CARDS, card_speed


def _decide(card_gib, speed, context=16384, **kw):
    config = shape_config("4B", "mlx4")
    card = Card(total=int(card_gib * GIB), free=int(card_gib * GIB), speed=speed)
    specs = shape_tensor_specs(config, "mlx4")
    return decide(specs, config, EngineSettings(), card, context=context, **kw)


def test_the_calibration_card_gets_back_what_it_measured():
    """Fitted to the 4B's 691 tokens/s and 1.34 s for a 16K prompt on the H200."""
    p = _decide(140, REFERENCE_CARDS["H200"]).prediction
    assert abs(p.decode_tok_s - 691) / 691 < 0.03
    assert abs(p.ttft_s - 1.34) / 1.34 < 0.1
    assert "16K prompt" in p.sentence() and "tokens/s" in p.sentence()


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
