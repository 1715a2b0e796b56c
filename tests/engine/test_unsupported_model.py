"""A model shape or a card the CUDA kernels do not cover is refused by name at load, before
anything is allocated, with the config key and value at fault and the numpy backend to use
instead; not with an AssertionError from a kernel wrapper in the middle of a request."""

from __future__ import annotations

import dataclasses

import pytest

from engine.backends.cuda import nvrtc, support
from engine.backends.cuda.card import ARCH_CARDS, runs_bf16
from engine.errors import BackendUnavailable, SnugError, UnsupportedModel
from engine.memory.shapes import SHAPES, shape_config
from tests.engine.cuda_fakes import use_card


def _4b(**changes):
    return dataclasses.replace(shape_config("4B", "mlx4"), **changes)


def test_a_key_head_dim_of_64_is_refused_with_its_key_and_the_numpy_backend():
    with pytest.raises(UnsupportedModel) as err:
        support.check_model(_4b(linear_key_head_dim=64), 90)
    text = str(err.value)
    assert "linear_key_head_dim = 64" in text and "128" in text
    assert "SNUG_BACKEND=numpy" in text and "--backend numpy" in text
    assert isinstance(err.value, BackendUnavailable) and isinstance(err.value, SnugError)


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"linear_value_head_dim": 130}, "linear_value_head_dim = 130"),
        ({"linear_conv_kernel_dim": 1}, "linear_conv_kernel_dim = 1"),
        ({"head_dim": 80}, "head_dim = 80"),
        ({"num_attention_heads": 48, "num_key_value_heads": 4}, "num_attention_heads = 48"),
        ({"head_dim": 800}, "head_dim = 800"),  # attn_decode's partials: 48 KiB static
    ],
)
def test_each_shape_the_kernels_do_not_take_names_its_key(changes, key):
    reason = support.model_refusal(_4b(**changes))
    assert reason is not None and key in reason and "numpy" in reason


@pytest.mark.parametrize("capability", sorted(ARCH_CARDS))
def test_every_qwen35_size_loads_on_every_tested_card(capability):
    for size in SHAPES:
        for fmt in ("mlx4", "bf16"):
            for dtype in ("bfloat16", "float16", "float32"):
                if dtype == "bfloat16" and not runs_bf16(capability):
                    continue
                support.check_model(shape_config(size, fmt), capability, dtype)


def test_cards_and_dtypes_the_kernels_do_not_cover():
    with pytest.raises(UnsupportedModel, match="compute capability 6.1"):
        support.check_model(shape_config("0.8B"), 61, "float16")
    with pytest.raises(UnsupportedModel, match="SNUG_COMPUTE_DTYPE=float16"):
        support.check_model(shape_config("0.8B"), 75, "bfloat16")
    support.check_model(shape_config("0.8B"), 75, "float16")


@pytest.mark.parametrize(
    "capability, version, refused",
    [
        (120, (12, 4), True),  # RTX 50 series: sm_120 arrived in 12.8
        (120, (12, 8), False),
        (121, (12, 8), False),  # sm_120's machine code runs there
        (100, (12, 6), True),
        (103, (12, 8), True),
        (90, (11, 8), True),  # common.cuh's cp.async.bulk.prefetch: PTX ISA 8.0 (12.0)
        (90, (12, 0), False),
        (89, (11, 8), False),
        (86, (11, 0), True),
        (75, (12, 0), False),
    ],
)
def test_an_nvrtc_too_old_for_the_card_is_refused_by_name(capability, version, refused):
    reason = support.nvrtc_refusal(capability, version)
    assert (reason is not None) == refused
    if refused:
        assert f"sm_{capability}" in reason and f"NVRTC {version[0]}.{version[1]}" in reason
        assert "nvidia-cuda-nvrtc-cu12>=" in reason and "numpy" in reason


def test_an_architecture_the_table_does_not_know_asks_nvrtc():
    archs = (75, 80, 86, 89, 90, 100, 120)
    assert support.nvrtc_refusal(130, (13, 2), archs) is not None
    assert support.nvrtc_refusal(130, (13, 2), (*archs, 130)) is None
    assert support.nvrtc_refusal(132, (13, 2), (*archs, 130)) is None  # 13.0's code runs


def test_the_backend_refuses_before_it_allocates(monkeypatch):
    """An RTX 50 card with an NVRTC from before 12.8: the constructor refuses before it
    makes a stream, a pool or a compile; a key head dim of 64 is refused by load_weights and
    alloc_state before the upload or the state."""
    import cupy

    from engine.backends.cuda.backend import CudaBackend

    use_card(monkeypatch, ARCH_CARDS[120])
    monkeypatch.setattr(nvrtc, "loaded_version", lambda: (12, 4))
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: (75, 80, 86, 89, 90))

    def no_stream(*args, **kwargs):
        raise AssertionError("allocated before the refusal")

    monkeypatch.setattr(cupy.cuda, "Stream", no_stream)
    with pytest.raises(UnsupportedModel, match=r"NVRTC 12\.4 .* \(sm_120\): it needs NVRTC 12\.8"):
        CudaBackend(dtype="bfloat16")

    be = CudaBackend.__new__(CudaBackend)  # as constructed on an H200, without the CUDA side
    be.card, be.dtype = ARCH_CARDS[90], "bfloat16"
    config = _4b(linear_key_head_dim=64)
    with pytest.raises(UnsupportedModel, match="linear_key_head_dim = 64"):
        be.load_weights(None, config)  # the checkpoint is never read
    with pytest.raises(UnsupportedModel, match="linear_key_head_dim = 64"):
        be.alloc_state(config, 1, 128)


def test_the_loaded_nvrtc_compiles_for_every_tested_card():
    """The NVRTC installed with the cuda12 extra (12.8 or newer) lists every tested
    architecture, RTX 50 included."""
    pytest.importorskip("cupy")
    version = nvrtc.loaded_version()
    for capability in ARCH_CARDS:
        assert support.nvrtc_refusal(capability, version, nvrtc.supported_archs()) is None
