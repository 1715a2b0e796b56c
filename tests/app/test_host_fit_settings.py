"""CPU mode's RAM estimate follows the settings that change what the numpy backend holds:
the 8-bit KV cache (codes and a float32 scale per token and KV head) and drafting (the MTP
head's weights, its KV cache and the verify's rows)."""

from __future__ import annotations

import dataclasses

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
