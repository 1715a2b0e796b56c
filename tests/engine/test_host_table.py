"""An embedding table kept in host memory (invariant 7), without a GPU: the mapped table holds
what the gather kernels read on the card (dense rows in the activation type; 4-bit codes in
MLX's row order with scales and biases in the activation type), the catalog holds the
gather that reads it, and the decision predicts the decode speed of the table on the card
(the gather reads one row either way)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda import host_table as ht
from engine.backends.cuda.card import ARCH_CARDS
from engine.backends.cuda.catalog import modules, requests
from engine.backends.cuda.norms import embed_symbol
from engine.backends.cuda.weights import DWeight, QWeight
from engine.bf16 import from_bf16
from engine.checkpoint import Checkpoint
from engine.checkpoint.quantized import unpack_codes
from engine.config import GIB, EngineSettings
from engine.memory import Card, Verdict, decide
from engine.memory.shapes import shape_config, shape_tensor_specs
from engine.memory.speed import REFERENCE_CARDS
from engine.testing.synth import SHAPES, write_checkpoint

UNTIED = dict(SHAPES["tiny"], tie_word_embeddings=False)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    root = tmp_path_factory.mktemp("untied")
    return {
        f: Checkpoint.open(write_checkpoint(root / f, UNTIED, f, seed=11)) for f in ("mlx4", "bf16")
    }


@pytest.fixture(autouse=True)
def host_memory(monkeypatch):
    """Mapped memory as a host buffer the "device" array shares; reads in small runs, so
    the table is filled across several runs and a partial last one."""

    def mapped(nbytes, use=None):
        buf = np.zeros(nbytes, np.uint8)
        return buf, buf

    monkeypatch.setattr(ht, "mapped", mapped)
    monkeypatch.setattr(ht, "ROWS_PER_READ", 100)


def _act(x: np.ndarray, dtype: str) -> np.ndarray:
    """Stored activations as float32."""
    return from_bf16(x) if dtype == "bfloat16" else x.astype(np.float32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_quantized_table_keeps_its_codes_in_row_order(untied, dtype):
    ck = untied["mlx4"]
    table = ht.host_table(ck, "embed_tokens", dtype)
    assert isinstance(table, QWeight) and not table.blocked
    packed, scales, biases = ck.read_raw("embed_tokens")
    V, H = table.shape
    assert (V, H) == tuple(ck.tensors["embed_tokens"].shape)
    assert np.array_equal(table.packed, np.asarray(packed).view(np.uint32).reshape(V, -1))
    assert table.scales.dtype == ht.to_act(np.zeros(1, np.float32), dtype).dtype
    # What embed_q<bits, 0> computes from these arrays is the checkpoint's dequantized row.
    ids = np.array([0, 1, 99, 100, 517, V - 1])
    q = unpack_codes(table.packed[ids], table.bits).astype(np.float32)
    g = table.group_size
    s, b = _act(table.scales[ids], dtype), _act(table.biases[ids], dtype)
    rows = (q.reshape(len(ids), -1, g) * s[:, :, None] + b[:, :, None]).reshape(len(ids), H)
    want = ck.read("embed_tokens").dequantize(ids)
    if dtype == "float16":  # the file's bf16 scales and biases rounded to fp16
        assert np.allclose(rows, want, rtol=1e-2, atol=1e-3)
    else:  # kept exactly
        assert np.array_equal(rows, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_dense_table_is_stored_in_the_activation_type(untied, dtype):
    ck = untied["bf16"]
    table = ht.host_table(ck, "embed_tokens", dtype)
    assert isinstance(table, DWeight)
    want = ck.read("embed_tokens")
    if dtype == "bfloat16":  # the file's bf16 bits, unchanged
        assert np.array_equal(table.data, np.asarray(ck.read_raw("embed_tokens")))
    else:
        assert np.array_equal(table.data, want.astype(table.data.dtype))


def test_rounding_to_the_activation_type_is_to_nearest_even():
    """As the device's cvt.rn conversions round: a tie goes to the even neighbour."""
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-12], np.float32)
    assert np.array_equal(from_bf16(ht.to_act(x, "bfloat16")), [1, 1 + 2**-6, 1])
    y = np.array([1 + 2**-11, 1 + 3 * 2**-11], np.float32)
    assert np.array_equal(ht.to_act(y, "float16"), [1, 1 + 2**-9])


def test_the_catalog_holds_the_row_order_gather_of_an_untied_table():
    card = ARCH_CARDS[90]
    untied = shape_config("9B", "mlx4")
    assert not untied.tie_word_embeddings
    held = requests(modules(untied, shape_tensor_specs(untied, "mlx4"), "bfloat16", card))
    assert {("quant.cu", embed_symbol(4, True)), ("quant.cu", embed_symbol(4, False))} <= held
    tied = shape_config("4B", "mlx4")
    held = requests(modules(tied, shape_tensor_specs(tied, "mlx4"), "bfloat16", card))
    assert ("quant.cu", embed_symbol(4, False)) not in held  # the head's table stays blocked


def test_host_embeddings_predict_the_decode_speed_of_the_table_on_the_card():
    config = shape_config("9B", "mlx4")
    specs, s, speed = shape_tensor_specs(config, "mlx4"), EngineSettings(), REFERENCE_CARDS["H200"]

    def at(gib: float):
        card = Card(total=int(gib * GIB), free=int(gib * GIB), speed=speed)
        return decide(specs, config, s, card, context=2048, max_rows=256)

    host = next(
        d
        for gib in np.arange(4.0, 12.0, 0.05)
        if (d := at(gib)).verdict is Verdict.FITS_HOST_EMBEDDINGS
    )
    card = at(40.0)
    assert not card.host_embeddings and card.breakdown.weights > host.breakdown.weights
    assert host.prediction.decode_tok_s == pytest.approx(card.prediction.decode_tok_s)
