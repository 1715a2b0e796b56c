"""The kernel choices and launch geometry come from the card's properties: decided without a
GPU, on the properties launch.py caches for a device (compute capability, SM count, L2,
shared memory a block may opt in to), set here for a card we do not have.

A 20-SM, 2 MB L2, 99 KiB card (an RTX 3050's numbers) keeps the tensor-core projection for
every decode projection of the 4B at 1 to 4 streams: the shared memory is budgeted for the
variant that runs (its threads, its prologue or none), not for the largest variant with a
norm weight, which made the down projection fall back to dequantize + cuBLAS from 3 streams.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda import launch
from engine.backends.cuda.attention import COMBINE_SPLITS, Attention, decode_kernel
from engine.backends.cuda.card import ARCH_CARDS, Card
from engine.backends.cuda.deltanet import DeltaNet, chunk_rows_for, step_kernel
from engine.backends.cuda.gemv_plan import (
    GEMV4_VARIANTS,
    Prologue,
    gemv4_blocks,
    gemv4_smem,
    gemv4_static_smem,
    gemv4_threads,
)
from engine.backends.cuda.projections import Pro, Projections
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.weights import QWeight
from engine.memory.scratch import decode_splits
from engine.memory.shapes import shape_config
from tests.engine.cuda_fakes import DeviceArray, Fn, RecordingKernels, use_card

SMALL = Card(86, 20, 2 << 20, 99 * 1024)
H200 = ARCH_CARDS[90]


def _projections(monkeypatch) -> tuple[Projections, RecordingKernels]:
    k = RecordingKernels()
    p = Projections(k)
    monkeypatch.setattr(
        p, "gemv4_kernel", lambda R, sw, v, kind=0: Fn(p.gemv4_symbol(R, sw, v, kind))
    )
    # the occupancy calculator's answer for these wide blocks: one block an SM
    monkeypatch.setattr(p, "_gemv4_resident", lambda fn, threads, smem: launch.sm_count())
    return p, k


def _weight(p: Projections, out: int, cols: int) -> QWeight:
    packed = np.zeros((out, cols // 8), np.uint32)
    sb = np.zeros((out, cols // 64), np.uint16)
    return QWeight(packed, sb, sb, 4, 64, (out, cols), blocked=p.blocks_ok(4, 64, cols))


def _4b_projections(p: Projections) -> dict[str, tuple[QWeight, Prologue, bool]]:
    """The 4B's decode projections (MLX 4-bit): weight, prologue, SwiGLU."""
    c = shape_config("4B", "mlx4")
    H, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
    return {
        "in_proj_qkv": (_weight(p, c.conv_dim, H), Prologue.NONE, False),
        "out_proj": (_weight(p, H, c.value_dim), Prologue.GATED_NORM, False),
        "q_proj": (_weight(p, 2 * c.num_attention_heads * c.head_dim, H), Prologue.NONE, False),
        "o_proj": (_weight(p, H, c.num_attention_heads * c.head_dim), Prologue.NONE, False),
        "gate_up": (_weight(p, I, H), Prologue.ADD_NORM, True),
        "down": (_weight(p, H, I), Prologue.NONE, False),
        "head": (_weight(p, V, H), Prologue.ADD_NORM, False),
    }


def _launches(p, k, R, w, kind, swiglu):
    """Every candidate's launch of this product at R rows: (symbol, grid, block, smem)."""
    x = DeviceArray((R, w.shape[1]))
    pro = None
    if kind:
        pro = Pro(
            kind,
            DeviceArray((w.shape[1],), 4),
            1e-6,
            o=DeviceArray((R, w.shape[1]), 4),
            head_dim=128,
        )
        assert p.pro_ok(x, w, kind, head_dim=128)
    up = w if swiglu else None
    k.launches.clear()
    for choice in p.gemv_candidates(x, w, up, pro):
        assert choice[0] == "mma"
        p.gemv_run(choice, x, w, DeviceArray((R, w.shape[0])), up, pro)
    return [launch_[:4] for launch_ in k.launches]


@pytest.mark.parametrize("streams", [1, 2, 3, 4])
def test_a_99k_card_keeps_the_tensor_core_kernel_for_every_4b_projection(monkeypatch, streams):
    use_card(monkeypatch, SMALL)
    assert launch.card() == SMALL
    p, k = _projections(monkeypatch)
    for name, (w, kind, swiglu) in _4b_projections(p).items():
        assert w.blocked, name
        assert p.gemv_ok(w, streams), name  # not dequantized for cuBLAS
        launches = _launches(p, k, streams, w, kind, swiglu)
        assert len(launches) == len(GEMV4_VARIANTS), (name, streams)  # every variant fits
        R, cols = streams, w.shape[1]
        pro = int(kind) if kind != Prologue.GATED_NORM else int(Prologue.GATED_NORM_FOLDED)
        for (sym, grid, block, smem), v in zip(launches, GEMV4_VARIANTS, strict=True):
            assert sym == Projections.gemv4_symbol(R, swiglu, v, pro)
            threads = gemv4_threads(cols, v)[1]
            assert block == (threads,) and smem == gemv4_smem(R, cols, threads, pro)
            assert smem + gemv4_static_smem(pro) <= SMALL.smem_per_block
            # capped at what the GPU holds at once (here one block on each of 20 SMs)
            assert grid == (min(gemv4_blocks(w.shape[0], swiglu, v[1]), 20),)


def test_the_down_projection_is_budgeted_for_the_variant_that_runs(monkeypatch):
    """The 4B's down projection (9216 columns in) at 3 streams: the largest variant (1024
    threads) plus a norm weight it does not have would take 113 KB, more than 99 KiB; each
    variant's own need fits. At 5 streams only the 256-thread variants fit; the 9B fits
    at 2 and 3 streams, the 2B at 5."""
    use_card(monkeypatch, SMALL)
    p, _ = _projections(monkeypatch)
    assert gemv4_smem(3, 9216, 1024, Prologue.ADD_NORM) > SMALL.smem_per_block
    down = _weight(p, 2560, 9216)
    assert p.gemv_candidates(DeviceArray((3, 9216)), down) == [("mma", *v) for v in GEMV4_VARIANTS]
    five = p.gemv_candidates(DeviceArray((5, 9216)), down)
    assert [c[1:] for c in five] == [v for v in GEMV4_VARIANTS if gemv4_threads(9216, v)[1] == 256]
    for rows, cols, n_out in ((2, 12288, 4096), (3, 12288, 4096), (5, 6144, 2048)):
        assert p.gemv_ok(_weight(p, n_out, cols), rows), (rows, cols)
    assert not p.gemv_ok(_weight(p, 4096, 12288), 4)  # 9B at 4 streams: cuBLAS


@pytest.mark.parametrize("streams", [1, 2, 3, 4])
def test_a_99k_card_runs_the_one_block_deltanet_step_and_4_warp_attention(monkeypatch, streams):
    use_card(monkeypatch, SMALL)
    k = RecordingKernels()
    c = shape_config("4B", "mlx4")
    Hk, Hv, dk, dv, K = 16, 32, 128, 128, 4
    assert step_kernel(Hk, Hv, dk, dv, K, 4, launch.compute_capability()) == (
        "gdn_step<8>",
        1,
        1024,
    )
    dn = DeltaNet(k, None, None, None, Tuning())
    assert dn.split_shape(Hk, Hv, dk, dv) is None and dn.chunk_rows() == 32
    dn.step(
        *(DeviceArray((streams, 8)),) * 8,
        (DeviceArray((streams,)),) * 3,
        streams,
        None,
        (Hk, Hv, dk, dv, K),
    )
    sym, grid, block, smem, args = k.launches[-1]
    assert (sym, grid, block, smem) == ("gdn_step<8>", (16, streams), (1024,), 0)
    assert [int(a) for a in args[-6:]] == [0] * 6  # nothing brought toward L2
    heads = (c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    at = Attention(k, None, None, Tuning())
    for nsmax in (32, 128):  # the graph for short rows, and the context's splits
        at.decode(DeviceArray((streams, 8)), *(None,) * 6, heads, 8192, 32, nsmax)
        assert k.launches[-1][:3] == ("attn_decode<8,4,4,4>", (nsmax, 4, streams), (128,))
    # 8 warps where splits x KV heads x rows fit the SMs (a 32-key context, one stream)
    assert decode_kernel(4, 256, 1, 4, 1, launch.sm_count()) == ("attn_decode<8,4,4,8>", 8)


def test_attn_combine_holds_every_split_the_longest_context_makes():
    """attn_combine keeps up to COMBINE_SPLITS splits' (max, sum) pairs in registers (four
    chunks of 32 lanes); the splits of any context stay within it, and more are refused."""
    assert decode_splits(1 << 30)[1] <= COMBINE_SPLITS
    k = RecordingKernels()
    at = Attention(k, None, None, Tuning())
    at.combine(None, None, None, None, DeviceArray((1, 8)), (8, 2, 256), 32, COMBINE_SPLITS)
    assert k.launches[-1][:3] == ("attn_combine", (1, 8), (256,))
    with pytest.raises(AssertionError):
        at.combine(None, None, None, None, DeviceArray((1, 8)), (8, 2, 256), 32, 2 * COMBINE_SPLITS)


@pytest.mark.parametrize("streams", [1, 2, 3, 4])
def test_an_h200_keeps_its_choices(monkeypatch, streams):
    """The same walk on an H200's properties gives what it ran before: every variant of every
    projection, the DeltaNet step over a cluster of 4 blocks a key head, 64-row chunks."""
    use_card(monkeypatch, H200)
    p, k = _projections(monkeypatch)
    for name, (w, kind, swiglu) in _4b_projections(p).items():
        assert len(_launches(p, k, streams, w, kind, swiglu)) == len(GEMV4_VARIANTS), name
    assert step_kernel(16, 32, 128, 128, 4, 4, 90) == ("gdn_step_split<4,4>", 4, 512)
    assert chunk_rows_for(H200.smem_per_block) == 64
    nw = 8 if 32 * 4 * streams <= 132 else 4
    assert decode_kernel(4, 256, 32, 4, streams, 132)[1] == nw
