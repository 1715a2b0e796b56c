"""Where a decode step's DeltaNet runs out_proj in its own launch (deltanet_out.py), what that
launch is given, and the scratch it carves; no GPU needed (the launches are recorded).
tests/device/test_step_out.py runs it against out_proj's own launch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.backends.cuda.card import ARCH_CARDS
from engine.backends.cuda.deltanet_out import STATIC_SMEM, StepOut, out_kernel, out_smem
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.weights import QWeight
from engine.config import LINEAR
from engine.memory import scratch_layout
from engine.memory.shapes import shape_config
from tests.engine.cuda_fakes import DeviceArray, RecordingKernels, use_card
from tests.engine.test_device_properties import SMALL

H200 = ARCH_CARDS[90]


def _dims(size: str) -> tuple:
    c = shape_config(size, "mlx4")
    heads = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim)
    return (*heads, c.linear_value_head_dim, c.linear_conv_kernel_dim), c.hidden_size


def _out_proj(hidden: int, cols: int, bits: int = 4, group: int = 64, blocked=True) -> QWeight:
    packed = DeviceArray((hidden, cols * bits // 32), 4)
    sb = DeviceArray((hidden, cols // group))
    return QWeight(packed, sb, sb, bits, group, (hidden, cols), blocked=blocked)


class _Frame:
    """Frame.take and Frame.segs as the launch reads them."""

    def __init__(self) -> None:
        self.taken: list[tuple] = []

    def take(self, shape, dtype=None):
        self.taken.append((shape, None if dtype is None else np.dtype(dtype).name))
        return DeviceArray(shape, 2 if dtype is None else np.dtype(dtype).itemsize)

    def segs(self, S):
        return (DeviceArray((S,), 4),) * 3


@pytest.mark.parametrize(
    "size, want",
    [("0.8B", "gdn_step_out<2,4,32>"), ("2B", "gdn_step_out<2,4,32>")]
    + [("4B", "gdn_step_out<4,4,64>"), ("9B", "gdn_step_out<4,4,64>")],
)
def test_every_size_has_its_instance_on_cluster_cards(size, want):
    dims, hidden = _dims(size)
    sym, threads, cb = out_kernel(*dims, 4, 90, hidden, "bfloat16")
    assert (sym, threads) == (want, 512)
    assert cb == int(want.rstrip(">").split(",")[-1])
    # the block's codes, scales, biases and products fit an H200's block with room to spare
    assert out_smem(hidden, cb, 2) + STATIC_SMEM < H200.smem_per_block


def test_where_the_fused_step_does_not_apply():
    dims, hidden = _dims("4B")
    assert out_kernel(*dims, 4, 90, hidden, "float32") is None  # no 4-bit gemv in fp32
    assert out_kernel(*dims, 4, 86, hidden, "bfloat16") is None  # no clusters: one block
    assert out_kernel(*dims, 4, 120, hidden, "bfloat16") is None
    assert out_kernel(*dims, 0, 90, hidden, "bfloat16") is None  # one block a key head
    assert out_kernel(*dims, 2, 90, hidden, "bfloat16") is None  # 128 columns a block
    assert out_kernel(*dims, 4, 90, hidden + 8, "bfloat16") is None  # rows not in 4 slices
    assert out_kernel(*dims[:4], 5, 4, 90, hidden, "bfloat16") is None  # five conv taps


def test_the_weight_and_the_card_decide(monkeypatch):
    use_card(monkeypatch, H200)
    c = shape_config("4B", "mlx4")
    z = DeviceArray((1, c.value_dim))
    so = StepOut(RecordingKernels(), _Frame(), Tuning())
    w = _out_proj(c.hidden_size, c.value_dim)
    assert so.kernel(c, z, w, 90) is None  # no tickets before the state is allocated
    so.tickets = DeviceArray((8,), 4)
    sym, threads, cb, smem = so.kernel(c, z, w, 90)
    assert (sym, threads, cb, smem) == ("gdn_step_out<4,4,64>", 512, 64, out_smem(2560, 64, 2))
    assert so.kernel(c, z, _out_proj(c.hidden_size, c.value_dim, bits=8), 90) is None
    assert so.kernel(c, z, _out_proj(c.hidden_size, c.value_dim, group=32), 90) is None
    assert so.kernel(c, z, _out_proj(c.hidden_size, c.value_dim, blocked=False), 90) is None
    off = StepOut(RecordingKernels(), _Frame(), Tuning(fused_out_proj=False))
    off.tickets = so.tickets
    assert off.kernel(c, z, w, 90) is None
    use_card(monkeypatch, SMALL)  # 99 KiB a block: the 9B's 163 KiB does not fit
    c9 = shape_config("9B", "mlx4")
    w9 = _out_proj(c9.hidden_size, c9.value_dim)
    assert so.kernel(c9, DeviceArray((1, c9.value_dim)), w9, 90) is None


@pytest.mark.parametrize("streams", [1, 3])
def test_the_launch(monkeypatch, streams):
    use_card(monkeypatch, H200)
    c = shape_config("0.8B", "mlx4")
    k, frame = RecordingKernels(), _Frame()
    so = StepOut(k, frame, Tuning())
    so.tickets = DeviceArray((4 * streams,), 4)
    z = DeviceArray((streams, 3 * c.value_dim))[:, : c.value_dim]  # a view of a wider buffer
    w = _out_proj(c.hidden_size, c.value_dim)
    kernel = so.kernel(c, z, w, 90)
    step = tuple(DeviceArray((streams, 8)) for _ in range(8))
    out = so.run(kernel, step, frame.segs(streams)[:2], streams, z, "nw", 1e-6, w, c, ())
    sym, grid, block, smem, args = k.launches[-1]
    Hk = c.linear_num_key_heads
    assert (sym, grid, block) == ("gdn_step_out<2,4,32>", (Hk * 4, streams), (512,))
    assert smem == out_smem(c.hidden_size, 32, 2)
    assert frame.taken == [((streams, Hk, c.hidden_size), "float32"), ((streams, 1024), None)]
    assert out.shape == (streams, c.hidden_size)
    assert args[:8] == step
    dims = [int(a) for a in args[10:14]]
    assert dims == [Hk, c.linear_num_value_heads, 128, c.linear_conv_kernel_dim]
    assert args[14] is z and int(args[15]) == 3 * c.value_dim  # z's row stride
    assert args[16] == "nw" and args[18] is w.packed and int(args[21]) == c.hidden_size
    assert args[23] is so.tickets and args[24] is out and int(args[25]) == c.hidden_size
    assert [int(a) for a in args[26:]] == [0] * 4  # nothing brought toward L2 without prefetch


def test_the_step_scratch_holds_the_partial_sums():
    """A step's DeltaNet carves its key heads' partial products: the layout measures them
    (a model of DeltaNet layers only, so the DeltaNet buffers are the layer's mixer)."""
    c = shape_config("4B", "mlx4")
    c = dataclasses.replace(c, layer_types=(LINEAR,) * c.num_hidden_layers)
    layout = scratch_layout(c, 4, 2, step_rows=4, context=4096)
    assert layout.get("r0.gdn_part").shape == (4, c.linear_num_key_heads, c.hidden_size)
    assert layout.get("r0.gdn_part").dtype == "float32"
