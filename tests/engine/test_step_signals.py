"""The DeltaNet input group's flags (engine/backends/cuda/signals.py), decided without a GPU:
only the forward's one-row launch of a group whose step kernel reads it sets them, with one
flag for each virtual block (tiles a block x 16 rows) of the rows before in_proj_z; a launch
timed alone, a group of more rows, a group with nothing to signal or a disabled card sets
none; the step kernel is handed what was armed, once. Launches are recorded
(tests/engine/cuda_fakes.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.backends.cuda.signals import MAX_FLAGS, StepSignals
from engine.backends.cuda.weights import FUSED_GROUPS
from tests.engine.cuda_fakes import DeviceArray, use_card
from tests.engine.test_batch_invariant import EPS, H200, C, _group, _projections

H, Hv = C.hidden_size, C.linear_num_value_heads


def _armed(monkeypatch):
    use_card(monkeypatch, H200)
    p, k = _projections(monkeypatch, invariant=False)
    p.signals.enabled = True
    p.signals.flags, p.signals.ticket = DeviceArray((MAX_FLAGS,), 4), DeviceArray((1,), 4)
    parts = _group(p, [C.conv_dim, Hv, Hv, C.value_dim], H)  # weights.FUSED_GROUPS' order
    fused = parts[0].fused
    fused.signal_rows = C.conv_dim + 2 * Hv
    parts = [replace(q, fused=fused) for q in parts]
    return p, k, parts


def _flag_args(launch_: tuple) -> tuple:
    return launch_[4][-2:]  # gemv4's last two arguments: flags, how many


def test_z_is_stored_last_in_the_deltanet_input_group():
    groups = dict(FUSED_GROUPS)
    assert groups["linear_attn."][-1] == "in_proj_z"
    assert set(groups["linear_attn."][:-1]) == {"in_proj_qkv", "in_proj_b", "in_proj_a"}


def test_the_forwards_one_row_group_launch_sets_a_flag_a_virtual_block(monkeypatch):
    p, k, parts = _armed(monkeypatch)
    x, delta, nw = DeviceArray((1, H)), DeviceArray((1, H)), DeviceArray((H,), 4)
    assert p.norm_linear_many(x, delta, nw, EPS, parts) is not None
    (launch_,) = k.launches
    flags, n = _flag_args(launch_)
    tiles = int(launch_[0].split(",")[2])  # gemv4<rows,swiglu,tiles a block,...>
    rows = 16 * tiles
    assert flags is p.signals.flags and n == -(-(C.conv_dim + 2 * Hv) // rows)
    assert p.signals.take() == (rows, int(n)) and p.signals.take() is None  # handed out once


def test_launches_without_a_step_kernel_after_them_set_no_flags(monkeypatch):
    p, k, parts = _armed(monkeypatch)
    fused = parts[0].fused
    x = DeviceArray((1, H))
    p.gemv(x, fused, DeviceArray((1, fused.shape[0])))  # a group's launch not from the forward
    assert _flag_args(k.launches[-1])[1] == 0 and p.signals.take() is None
    choice = p.tuner.choice[p.gemv_key(x, fused)]
    p.gemv_run(choice, x, fused, DeviceArray((1, fused.shape[0])))  # as the timing runs it
    assert _flag_args(k.launches[-1])[1] == 0 and p.signals.take() is None
    p.signals.enabled = False  # a card without the cluster step kernel
    nw = DeviceArray((H,), 4)
    p.norm_linear_many(x, DeviceArray((1, H)), nw, EPS, parts)
    assert _flag_args(k.launches[-1])[1] == 0 and p.signals.take() is None


@pytest.mark.parametrize(
    "signal_rows, choice, want",
    [
        (8256, ("mma", 5, 2, 8, False), (32, 258)),
        (8256, ("mma", 16, 1, 2, True), (16, 516)),
        (6176, ("mma", 2, 2, 8, False), (32, 193)),
        (0, ("mma", 5, 2, 8, False), None),
        (8256, ("tc", 8), None),
        (16 * MAX_FLAGS + 1, ("mma", 16, 1, 2, True), None),
    ],
)
def test_arm_counts_the_virtual_blocks_of_the_signalled_rows(signal_rows, choice, want):
    sig = StepSignals()
    sig.enabled, sig.flags = True, object()
    got = sig.arm(signal_rows, choice)
    assert (got is None) is (want is None) and sig.take() == want
    if want is not None:
        assert got[0] is sig.flags and int(got[1]) == want[1]
