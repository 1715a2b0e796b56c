"""A context past the model's own limit is planned (and loaded) at that limit, and the
verdict says so, naming the setting: on the card and in CPU mode alike."""

from __future__ import annotations

from app.state.host_fit import host_decide
from engine.config import GIB, EngineSettings
from engine.memory import Card, decide
from engine.memory.shapes import shape_config, shape_tensor_specs


def _specs(shape, fmt):
    config = shape_config(shape, fmt)
    return config, shape_tensor_specs(config, fmt)


def test_a_context_past_the_models_limit_is_said_to_be_capped():
    config, specs = _specs("0.8B", "mlx4")
    top = config.max_position_embeddings
    card = Card(24 * GIB, 24 * GIB, fused_attention=True)
    d = decide(specs, config, EngineSettings(), card, context=1_000_000)
    assert d.fits and d.context == top
    assert (
        f"the context setting asks for 1,000,000 tokens, past this model's limit of {top:,}"
        in d.reason
    ), d.reason
    at_top = decide(specs, config, EngineSettings(), card, context=top)
    assert "past this model's limit" not in at_top.reason


def test_a_capped_context_that_does_not_fit_says_so_too():
    config, specs = _specs("4B", "bf16")
    card = Card(4 * GIB, 4 * GIB, fused_attention=True)
    d = decide(specs, config, EngineSettings(), card, context=1_000_000)
    assert not d.fits
    assert "1,000,000 tokens, past this model's limit" in d.reason, d.reason


def test_the_cpu_verdict_says_the_context_is_capped():
    config, specs = _specs("0.8B", "mlx4")
    d = host_decide(specs, config, available=256 * GIB, context=1_000_000, streams=1)
    assert d.fits and d.context == config.max_position_embeddings
    assert "the context setting asks for 1,000,000 tokens, past this model's limit" in d.reason
    exact = host_decide(specs, config, available=256 * GIB, context=4096, streams=1)
    assert "past this model's limit" not in exact.reason
