"""CPU mode's RAM estimate follows the settings that change what the numpy backend holds:
the 8-bit KV cache (codes and a float32 scale per token and KV head) and drafting (the MTP
head's weights, its KV cache and the verify's rows)."""

from __future__ import annotations

import dataclasses

import pytest

from app.state.host_fit import host_decide
from engine.config import EngineSettings
from engine.memory.arena import TensorSpec
from engine.memory.draft import expected_mtp_tensors
from engine.memory.shapes import shape_config, shape_tensor_specs

GIB = 1 << 30


def test_the_8_bit_kv_cache_shrinks_the_cpu_estimate_by_its_bytes():
    config = shape_config("4B", "mlx4")
    specs = shape_tensor_specs(config, "mlx4")
    kw = dict(available=64 * GIB, context=32768, streams=1)
    bf16 = host_decide(specs, config, **kw)
    int8 = host_decide(specs, config, settings=EngineSettings(kv_cache="int8"), **kw)
    full = len(config.full_layers) * 2 * config.num_key_value_heads * 32768
    want = full * (config.head_dim * 4 - (config.head_dim + 4))  # fp32 rows -> codes + scale
    got = bf16.breakdown["stream_state_each"] - int8.breakdown["stream_state_each"]
    assert got == want


def test_drafting_counts_the_mtp_head_where_the_checkpoint_has_one():
    config = dataclasses.replace(shape_config("0.8B", "bf16"), mtp_num_hidden_layers=1)
    specs = dict(shape_tensor_specs(config, "bf16"))
    specs |= {n: TensorSpec(shape) for n, shape in expected_mtp_tensors(config).items()}
    kw = dict(available=64 * GIB, context=4096, streams=1)
    off = host_decide(specs, config, **kw)
    on = host_decide(specs, config, settings=EngineSettings(draft_tokens="2"), **kw)
    assert on.breakdown["weights"] > off.breakdown["weights"]
    assert on.breakdown["stream_state_each"] > off.breakdown["stream_state_each"]
    plain = {n: s for n, s in specs.items() if not n.startswith("mtp.")}
    same = host_decide(plain, config, settings=EngineSettings(draft_tokens="2"), **kw)
    assert same.breakdown == host_decide(plain, config, **kw).breakdown  # cannot draft


def _apply(text, shape, fmt, context, streams, settings):
    """The inputs after one suggestion, read from its words (the load panel lists them)."""
    words = text.replace(",", "").split()
    if text.startswith("shorten the context to "):
        return shape, fmt, int(words[4]), streams, settings
    if text.startswith("use ") and words[2] in ("stream", "streams"):
        return shape, fmt, context, int(words[1]), settings
    if text.startswith("use the 8-bit KV cache"):
        return shape, fmt, context, streams, EngineSettings(kv_cache="int8")
    if text.startswith("use the MLX 4-bit build"):
        shorter = int(words[-2]) if text.endswith(" tokens") else context
        return shape, "mlx4", shorter, streams, settings
    raise AssertionError(text)


@pytest.mark.parametrize(
    ("shape", "fmt", "context", "streams", "ram_gib"),
    [
        ("0.8B", "mlx4", 262144, 4, 8),  # the state at the context is what is too large
        ("2B", "mlx4", 65536, 4, 8),
        ("4B", "bf16", 262144, 1, 8),  # the 4-bit build fits with a shorter context
        ("9B", "bf16", 8192, 1, 16),
        ("9B", "mlx4", 8192, 1, 4),  # nothing of this model fits
    ],
)
def test_too_large_for_ram_says_what_to_change_and_each_change_fits(
    shape, fmt, context, streams, ram_gib
):
    def decide(shape, fmt, context, streams, settings):
        config = shape_config(shape, fmt)
        specs = shape_tensor_specs(config, fmt)
        return host_decide(
            specs,
            config,
            available=ram_gib * GIB,
            context=context,
            streams=streams,
            settings=settings,
        )

    d = decide(shape, fmt, context, streams, EngineSettings())
    assert not d.fits and d.suggestions
    for text in d.suggestions:
        if text == "choose a smaller model":
            assert len(d.suggestions) == 1  # only where nothing else is enough
            continue
        assert not (fmt == "mlx4" and "4-bit" in text), text  # it is the 4-bit build
        assert decide(*_apply(text, shape, fmt, context, streams, EngineSettings())).fits, text
