"""Batch-invariant decode (EngineSettings.batch_invariant), decided without a GPU: in that
mode every row of a decode step is summed as it is at one row, so a stream's logits do not
depend on the streams beside it. The launches a step's projections and attention make are
recorded (tests/engine/cuda_fakes.py) at 1 to 8 rows, and past 8 in a step, and each row's
sum order (kernel, warps a tile, prologue) must be the one-row launch's; a chooser that
ranks the variants differently at each row count stands in for the timing, so outside the
mode the same walk finds orders that change with the batch."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

import numpy as np
import pytest

from engine.backends.cuda import launch, projection_tuning
from engine.backends.cuda.attention import Attention, decode_kernel
from engine.backends.cuda.card import ARCH_CARDS, Card
from engine.backends.cuda.gemv_plan import (
    GEMV4_VARIANTS,
    GEMV_SWIGLU_VARIANTS,
    GEMV_VARIANTS,
    Prologue,
    gemv4_threads,
    invariant_rows,
    prologue_fits,
    reduction_order,
)
from engine.backends.cuda.projections import Pro, Projections
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.weights import QWeight
from engine.config import EngineSettings
from engine.errors import ConfigError
from engine.memory.shapes import shape_config
from engine.server.cli import with_batch_invariant
from tests.engine.cuda_fakes import DeviceArray, Fn, RecordingKernels, use_card

H200 = ARCH_CARDS[90]
SMALL = Card(86, 20, 2 << 20, 99 * 1024)  # an RTX 3050's numbers
C = shape_config("4B", "mlx4")
EPS = 1e-6


class _Frame:
    """The scratch as the projections carve it: fresh device-array stand-ins."""

    def take(self, shape: tuple, dtype=None) -> DeviceArray:
        return DeviceArray(tuple(shape), 4 if dtype is not None else 2)


def _projections(monkeypatch, invariant: bool) -> tuple[Projections, RecordingKernels]:
    for name in ("_CHOICES", "_RANKED", "_STEP_TUNED"):  # a fresh process's choices
        monkeypatch.setattr(projection_tuning, name, {})
    k = RecordingKernels()
    p = Projections(k, _Frame(), None, invariant=invariant)
    monkeypatch.setattr(
        p, "gemv4_kernel", lambda R, sw, v, kind=0: Fn(p.gemv4_symbol(R, sw, v, kind))
    )
    monkeypatch.setattr(p, "_gemv4_resident", lambda fn, threads, smem: launch.sm_count())

    def no_cublas(*args):
        raise AssertionError("a decode row went to cuBLAS")

    monkeypatch.setattr(p, "gemm", no_cublas)

    def choose(key, x, w, out, up=None, pro=None, order=None):
        """The timing's stand-in: a different variant wins at each row count."""
        cands = p.gemv_candidates(x, w, up, pro, order)
        pick = cands[(7 * x.shape[0] + w.shape[0]) % len(cands)]
        p.tuner.choice[key] = pick
        return pick

    monkeypatch.setattr(p, "choose", choose)
    return p, k


def _weight(p: Projections, out: int, cols: int) -> QWeight:
    packed = np.zeros((out, cols // 8), np.uint32)
    sb = np.zeros((out, cols // 64), np.uint16)
    return QWeight(packed, sb, sb, 4, 64, (out, cols), blocked=p.blocks_ok(4, 64, cols))


def _group(p: Projections, sizes: list[int], cols: int) -> list[QWeight]:
    """A stored group (weights.FUSED_GROUPS): parts carved from one matrix."""
    fused, parts, row0 = _weight(p, sum(sizes), cols), [], 0
    for n in sizes:
        parts.append(replace(_weight(p, n, cols), fused=fused, row0=row0))
        row0 += n
    return parts


def _4b(p: Projections) -> dict:
    H, Hq, Hkv, hd = C.hidden_size, C.num_attention_heads, C.num_key_value_heads, C.head_dim
    Hv = C.linear_num_value_heads
    return {
        "gdn_in": _group(p, [C.conv_dim, C.value_dim, Hv, Hv], H),
        "attn_in": _group(p, [2 * Hq * hd, Hkv * hd, Hkv * hd], H),
        "out_proj": _weight(p, H, C.value_dim),
        "o_proj": _weight(p, H, Hq * hd),
        "mlp": [_weight(p, C.intermediate_size, H) for _ in range(2)]
        + [_weight(p, H, C.intermediate_size)],
        "head": _weight(p, C.vocab_size, H),
    }


_GEMV4 = re.compile(r"gemv4<(\d+),(\w+),(\d+),\d+,\w+,\d+,(\d+),\w+>")


def _rows_and_order(launch_: tuple) -> tuple[int, tuple]:
    """(rows, sum order of each of them) of one recorded gemv4 launch: the warps a tile
    (threads / 32 / tiles a block), the prologue, SwiGLU and the columns summed."""
    sym, _, block, _, args = launch_
    m = _GEMV4.fullmatch(sym)
    assert m, f"not a decode projection: {sym}"
    rows, swiglu, tpb, kind = int(m[1]), m[2], int(m[3]), int(m[4])
    return rows, (block[0] // 32 // tpb, kind, swiglu, int(args[11]))


def _step(p: Projections, k: RecordingKernels, R: int, w: dict) -> dict[str, tuple]:
    """Each op of a layer and the head at R rows: (the set of sum orders its launches use,
    rows x output rows they cover)."""
    H, VD = C.hidden_size, C.value_dim
    x, delta, nw = DeviceArray((R, H)), DeviceArray((R, H)), DeviceArray((H,), 4)
    z, o = DeviceArray((R, VD)), DeviceArray((R, VD), 4)
    gated = Pro(Prologue.GATED_NORM, DeviceArray((128,), 4), EPS, o=o, head_dim=128)
    assert p.pro_ok(z, w["out_proj"], Prologue.GATED_NORM, head_dim=128)
    ops = {
        "gdn_in": lambda: p.norm_linear_many(x, delta, nw, EPS, w["gdn_in"]),
        "attn_in": lambda: p.norm_linear_many(x, delta, nw, EPS, w["attn_in"]),
        "out_proj": lambda: p.gemv(z, w["out_proj"], DeviceArray((R, H)), pro=gated) or 1,
        "o_proj": lambda: p.linear(DeviceArray((R, w["o_proj"].shape[1])), w["o_proj"]),
        "mlp": lambda: p.norm_mlp(x, delta, nw, EPS, *w["mlp"]),
        "head": lambda: p.norm_linear_many(x, delta, nw, EPS, [w["head"]]),
    }
    out = {}
    for name, op in ops.items():
        k.launches.clear()
        assert op() is not None, f"{name} at {R} rows left the fused decode kernels"
        orders, covered = set(), 0
        for launch_ in k.launches:
            rows, order = _rows_and_order(launch_)
            orders.add(order)
            covered += rows * int(launch_[4][10])  # rows x output rows of the launch
        out[name] = (orders, covered)
    return out


def _covers(R: int, w: dict) -> dict[str, int]:
    """Rows x output rows each op must cover at R rows (gate and up count once: SwiGLU)."""
    gate, _, down = w["mlp"]
    return {
        "gdn_in": R * sum(q.shape[0] for q in w["gdn_in"]),
        "attn_in": R * sum(q.shape[0] for q in w["attn_in"]),
        "out_proj": R * C.hidden_size,
        "o_proj": R * C.hidden_size,
        "mlp": R * (gate.shape[0] + down.shape[0]),
        "head": R * C.vocab_size,
    }


@pytest.mark.parametrize("card", [H200, SMALL], ids=["h200", "99k-card"])
def test_each_row_is_summed_as_at_one_row_at_every_batch_size(monkeypatch, card):
    use_card(monkeypatch, card)
    p, k = _projections(monkeypatch, invariant=True)
    w = _4b(p)
    one = _step(p, k, 1, w)
    assert all(len(orders) >= 1 for orders, _ in one.values())
    for R in range(1, 9):
        got = _step(p, k, R, w)
        assert {n: o for n, (o, _) in got.items()} == {n: o for n, (o, _) in one.items()}, R
        assert {n: c for n, (_, c) in got.items()} == _covers(R, w), R
    # A decode step of more streams than one launch takes stays on these kernels too.
    p.step = True
    got = _step(p, k, 12, w)
    assert {n: o for n, (o, _) in got.items()} == {n: o for n, (o, _) in one.items()}
    assert {n: c for n, (_, c) in got.items()} == _covers(12, w)


def test_outside_the_mode_the_order_follows_the_batch(monkeypatch):
    """The same walk without the mode: the stored groups leave the fused kernel past one
    row (a separate norm, rounded before the product), and the chosen variants' warps a
    tile change with the rows."""
    use_card(monkeypatch, H200)
    p, k = _projections(monkeypatch, invariant=False)
    w = _4b(p)
    x, delta, nw = DeviceArray((2, C.hidden_size)), DeviceArray((2, C.hidden_size)), None
    assert p.norm_linear_many(x, delta, nw, EPS, w["gdn_in"]) is None
    head = {R: _step_head(p, k, R, w) for R in range(1, 9)}
    assert len(set(head.values())) > 1, head


def _step_head(p: Projections, k: RecordingKernels, R: int, w: dict) -> frozenset:
    x, delta = DeviceArray((R, C.hidden_size)), DeviceArray((R, C.hidden_size))
    k.launches.clear()
    nw = DeviceArray((C.hidden_size,), 4)
    assert p.norm_mlp(x, delta, nw, EPS, *w["mlp"]) is not None
    assert p.norm_linear_many(x, delta, nw, EPS, [w["head"]]) is not None
    return frozenset(_rows_and_order(launch_)[1] for launch_ in k.launches)


def test_a_launch_takes_fewer_rows_where_its_order_does_not_fit(monkeypatch):
    """On a 99 KiB card the 4B's down projection (9216 columns in) fits every variant up to
    4 rows and only the 256-thread ones at 5: a one-row choice of 32 warps a tile runs 8
    rows as two launches of 4, each in that order, never the variants of other orders."""
    use_card(monkeypatch, SMALL)
    p, k = _projections(monkeypatch, invariant=True)
    down = _weight(p, C.hidden_size, C.intermediate_size)
    wide = ("mma", 32, 1, 2, True)
    assert gemv4_threads(down.shape[1], wide[1:]) == (32, 1024)
    x1 = DeviceArray((1, down.shape[1]))
    p.tuner.choice[p.gemv_key(x1, down)] = wide  # as the timing chose it at one row
    order = reduction_order(wide, down.shape[1])
    assert invariant_rows(8, down.shape[1], order, 0, 0, SMALL.smem_per_block) == 4
    assert invariant_rows(8, down.shape[1], order, 0, 0, H200.smem_per_block) == 8
    k.launches.clear()
    p.gemv(DeviceArray((8, down.shape[1])), down, DeviceArray((8, down.shape[0])))
    assert [_rows_and_order(launch_) for launch_ in k.launches] == [(4, (32, 0, "false", 9216))] * 2


def test_reduction_orders():
    """gemv4's order is its warps a tile; the SIMT kernel's is the same in every variant."""
    for v in GEMV4_VARIANTS:
        assert reduction_order(("mma", *v), 2560) == ("mma", gemv4_threads(2560, v)[0])
    simt = {reduction_order(("old", *v), 2560) for v in GEMV_VARIANTS + GEMV_SWIGLU_VARIANTS}
    assert simt == {("old",)}
    # the auto-sized variants' warps follow the columns; the fixed ones do not
    assert reduction_order(("mma", 0, 1, 8, False), 2560) != reduction_order(
        ("mma", 0, 1, 8, False), 9216
    )
    # the prologue's sums bound the rows a launch: a slot a 256 columns, or a head, a row
    assert invariant_rows(8, 2560, ("mma", 4), Prologue.ADD_NORM, 0, H200.smem_per_block) == 8
    assert invariant_rows(8, 16384, ("mma", 4), Prologue.ADD_NORM, 0, H200.smem_per_block) == 4
    assert invariant_rows(8, 6144, ("mma", 4), Prologue.GATED_NORM_FOLDED, 48, 1 << 20) == 5
    assert invariant_rows(3, 2560, ("old",), 0, 0, H200.smem_per_block) == 3


def test_the_prologue_in_the_mode():
    """The add + norm stays in the projection in bf16 with rows a multiple of 256 wide (its
    sums one slot per 256 columns); fp16 adds its warps' sums with atomics, so there the
    norm runs as its own kernel. The gated norm is the same in and out of the mode."""
    args = (1, 2560, 9216, Prologue.ADD_NORM, 0, True)
    assert prologue_fits(*args, "bfloat16", True, 227 * 1024, invariant=True)
    assert not prologue_fits(*args, "float16", True, 227 * 1024, invariant=True)
    assert prologue_fits(*args, "float16", True, 227 * 1024)
    wide = (1, 2560 + 64, 9216, Prologue.ADD_NORM, 0, True)
    assert not prologue_fits(*wide, "bfloat16", True, 227 * 1024, invariant=True)
    assert prologue_fits(*wide, "bfloat16", True, 227 * 1024)
    gated = (1, 4096, 2560, Prologue.GATED_NORM, 128, True, "float16", True, 227 * 1024)
    assert prologue_fits(*gated, invariant=True) == prologue_fits(*gated)


@pytest.mark.parametrize("rows", range(1, 9))
def test_attention_splits_and_warps_do_not_follow_the_batch(monkeypatch, rows):
    """The split-KV decode attention: a row's splits come from its own length and the
    context (decode_splits); its warps a block, which share each split's keys, come from
    nothing else in the mode, in the graph for short rows (32 splits) and the context's."""
    use_card(monkeypatch, H200)
    k = RecordingKernels()
    heads = (C.num_attention_heads, C.num_key_value_heads, C.head_dim)
    at = Attention(k, None, None, Tuning())
    at.batch_invariant = True
    for nsmax in (32, 128):
        at.decode(DeviceArray((rows, 8)), *(None,) * 6, heads, 8192, 32, nsmax)
        sym, grid, block = k.launches[-1][:3]
        assert (sym, block) == ("attn_decode<8,4,4,8>", (256,)) and grid == (nsmax, 4, rows)
    # Outside the mode the warps follow the grid: 8 at one row of 32 splits, else 4.
    plain = {decode_kernel(4, 256, n, 4, rows, H200.sm_count) for n in (32, 128)}
    assert plain == ({("attn_decode<8,4,4,8>", 8)} if rows == 1 else set()) | {
        ("attn_decode<8,4,4,4>", 4)
    }


def test_the_setting_and_the_server_default(monkeypatch):
    assert EngineSettings().batch_invariant is False
    assert EngineSettings.from_env({"SNUG_BATCH_INVARIANT": "1"}).batch_invariant is True
    assert EngineSettings.from_env({"SNUG_BATCH_INVARIANT": " 0 "}).batch_invariant is False
    with pytest.raises(ConfigError, match="SNUG_BATCH_INVARIANT"):
        EngineSettings.from_env({"SNUG_BATCH_INVARIANT": "yes"})
    monkeypatch.delenv("SNUG_BATCH_INVARIANT", raising=False)
    base = EngineSettings()

    def serve(flag, streams):
        args = argparse.Namespace(batch_invariant=flag, streams=streams)
        return with_batch_invariant(base, args).batch_invariant

    assert serve(None, 4) is True and serve(None, 1) is False  # on with more than one stream
    assert serve("off", 4) is False and serve("on", 1) is True
    monkeypatch.setenv("SNUG_BATCH_INVARIANT", "0")
    assert serve(None, 4) is False


def test_the_catalog_holds_what_the_mode_runs():
    """The catalog cannot see the setting, so it lists what the mode may launch too: each
    stored group's parts with the add + norm at every row count, and the attention's
    8-warp instance."""
    from engine.backends.cuda.catalog import modules
    from engine.memory.shapes import shape_tensor_specs

    mods = modules(C, shape_tensor_specs(C, "mlx4"), "bfloat16", H200)
    gemv4 = {_GEMV4.fullmatch(m.names[0]).group(1, 2, 4) for m in mods if m.file == "gemv4.cu"}
    assert {(str(R), "false", "1") for R in range(1, 9)} <= gemv4  # rows, SwiGLU, ADD_NORM
    attention = {n for m in mods if m.file == "attention.cu" for n in m.names}
    assert "attn_decode<8,4,4,8>" in attention


def test_the_fixed_order_sums_compile():
    """gemv4 with SNUG_BATCH_INVARIANT (the add + norm's sums a slot per 256 columns)
    compiles: NVRTC for sm_90, where CI has no GPU."""
    pytest.importorskip("cuda.pathfinder")
    nvrtc = pytest.importorskip("engine.backends.cuda.nvrtc")
    if 90 not in nvrtc.supported_archs():
        pytest.skip("this NVRTC does not compile for sm_90")
    from engine.backends.cuda.gemv_plan import gemv4_module

    names = tuple(gemv4_module(3, False, Prologue.ADD_NORM))
    cubin = nvrtc.compile_module("gemv4.cu", names, "bfloat16", "sm_90", ("SNUG_BATCH_INVARIANT",))
    assert cubin[:4] == b"\x7fELF"


def test_a_prompt_window_takes_the_many_row_products_in_the_mode(monkeypatch):
    """A prompt's window of more than GEMV_MAX_ROWS rows is never shared with other streams,
    so the mode leaves it on the products made for many rows: no one-row launches of the
    decode kernels (which took a 256-token prompt 340 ms); a decode step of as many rows
    stays on them."""
    use_card(monkeypatch, H200)
    p, k = _projections(monkeypatch, invariant=True)
    w = _4b(p)
    R = 256
    x, delta = DeviceArray((R, C.hidden_size)), DeviceArray((R, C.hidden_size))
    nw = DeviceArray((C.hidden_size,), 4)
    k.launches.clear()
    assert p.norm_linear_many(x, delta, nw, EPS, w["gdn_in"]) is None  # norm, then cuBLAS
    assert p.group_order(x, w["gdn_in"]) is None and p.fit_rows(R) == R
    assert not k.launches
    p.step = True
    assert p.fit_rows(R) == 1 and p.group_order(x, w["gdn_in"]) is not None
