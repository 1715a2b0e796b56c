"""Which chunked delta rule a window runs, decided without a GPU: `gdn_chunk_tc` (TF32
tensor cores, 32-row chunks) where the model computes in bf16 or fp16 on sm_80 and newer; the
fp32 SIMT `gdn_chunk` for fp32 compute and on sm_75, at the largest chunk whose shared memory
a block may take. The catalog (what CI compiles) and the launch ask the same function."""

from __future__ import annotations

import re

import pytest

from engine.backends.cuda.card import ARCH_CARDS, runs_bf16
from engine.backends.cuda.catalog import modules
from engine.backends.cuda.deltanet import (
    DeltaNet,
    chunk_kernel,
    chunk_rows_for,
    chunk_tc_rows,
    chunk_tc_smem,
)
from engine.backends.cuda.modules import source
from engine.backends.cuda.tuning import Tuning
from engine.memory.shapes import shape_config, shape_tensor_specs
from tests.engine.cuda_fakes import DeviceArray, RecordingKernels, use_card

KIB = 1024


def _dtypes(capability: int) -> tuple[str, ...]:
    return ("bfloat16", "float16", "float32") if runs_bf16(capability) else ("float16", "float32")


@pytest.mark.parametrize("capability", list(ARCH_CARDS))
def test_half_precision_from_sm80_runs_on_tensor_cores(capability):
    card = ARCH_CARDS[capability]
    for dtype in _dtypes(capability):
        kern = chunk_kernel(dtype, capability, card.smem_per_block)
        assert kern is not None and kern.smem <= card.smem_per_block
        if dtype != "float32" and capability >= 80:
            assert (kern.file, kern.symbol, kern.rows) == (
                "gdn_chunk_tc.cu",
                "gdn_chunk_tc<32>",
                32,
            )
        else:  # fp32 compute, or no TF32 mma (sm_75)
            gc = chunk_rows_for(card.smem_per_block)
            assert (kern.file, kern.symbol) == ("gdn_chunk.cu", f"gdn_chunk<{gc}>")


def test_tensor_core_chunks_fit_each_card_they_are_offered_on():
    assert chunk_tc_smem(32) <= 99 * KIB < chunk_tc_smem(64)
    rows = {
        cap: chunk_tc_rows("bfloat16", cap, card.smem_per_block) for cap, card in ARCH_CARDS.items()
    }
    assert rows == {75: 0, 80: 32, 86: 32, 89: 32, 90: 32, 120: 32}
    assert chunk_tc_rows("float16", 90, chunk_tc_smem(32) - 1) == 0  # then gdn_chunk
    assert chunk_tc_rows("float32", 90, 227 * KIB) == 0


def test_the_shared_bytes_follow_the_kernels_buffers():
    """chunk_tc_smem is the formula at the top of gdn_chunk_tc.cu, on its own constants."""
    src = source("gdn_chunk_tc.cu")
    consts = dict(re.findall(r"\b(TK|TV) = (\d+)", src))
    TK, TV = int(consts["TK"]), int(consts["TV"])
    assert "TLK = TK + 4, TLV = TV + 8" in src
    formula = re.search(r"Dynamic shared memory: (4 \* \(.*\)) bytes", src).group(1)
    for gc in (32, 64):
        env = {"GC": gc, "TK": TK, "TLK": TK + 4, "TLV": TV + 8}
        assert eval(formula, {}, env) == chunk_tc_smem(gc)


@pytest.mark.parametrize("capability", list(ARCH_CARDS))
def test_the_catalog_lists_the_instance_that_runs(capability):
    card = ARCH_CARDS[capability]
    config = shape_config("4B", "mlx4")
    specs = shape_tensor_specs(config, "mlx4")
    for dtype in _dtypes(capability):
        listed = {
            (m.file, n)
            for m in modules(config, specs, dtype, card)
            for n in m.names
            if m.file.startswith("gdn_chunk")
        }
        kern = chunk_kernel(dtype, capability, card.smem_per_block)
        assert listed == {(kern.file, kern.symbol)}


class _Fp32Kernels(RecordingKernels):
    dtype, act_itemsize = "float32", 4


@pytest.mark.parametrize(
    "capability, kernels, want",
    [
        (90, RecordingKernels, "gdn_chunk_tc<32>"),
        (86, RecordingKernels, "gdn_chunk_tc<32>"),
        (90, _Fp32Kernels, "gdn_chunk<64>"),
        (75, _Fp32Kernels, "gdn_chunk<16>"),
    ],
)
def test_a_window_launches_the_chosen_kernel(monkeypatch, capability, kernels, want):
    use_card(monkeypatch, ARCH_CARDS[capability])
    k = kernels()
    dn = DeltaNet(k, None, None, None, Tuning())
    arrays = (DeviceArray((700, 8), 4),) * 6
    segs = (DeviceArray((2,), 4),) * 3
    assert dn.chunk(*arrays, segs, 2, DeviceArray((700, 8), 4), 16, 32, 128)
    sym, grid, block, smem, _ = k.launches[-1]
    assert (sym, grid, block) == (want, (32, 4, 2), (256,))
    assert smem == dn.chunk_kernel().smem <= ARCH_CARDS[capability].smem_per_block
