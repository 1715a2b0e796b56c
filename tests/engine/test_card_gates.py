"""The paths written for Hopper, each gated on the architectures it is meant for (card.py):
programmatic dependent launch from 9.0 on (consumer Blackwell included), the DeltaNet step
over a thread block cluster and the bulk L2 prefetch on the data-centre parts only (sm_90,
sm_100, sm_103), not on sm_120/121 where neither was measured. Checked on the properties
launch.py caches for a device, with no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda import launch
from engine.backends.cuda.card import Card, runs_bulk_prefetch, runs_cluster_split, runs_pdl
from engine.backends.cuda.deltanet import DeltaNet
from engine.backends.cuda.tuning import Tuning
from engine.backends.cuda.weights import QWeight
from tests.engine.cuda_fakes import DeviceArray, use_card

# capability: (PDL, cluster step, bulk prefetch)
GATES = {
    75: (False, False, False),
    80: (False, False, False),
    86: (False, False, False),
    89: (False, False, False),
    90: (True, True, True),
    100: (True, True, True),
    103: (True, True, True),
    120: (True, False, False),
    121: (True, False, False),
}


class _Dev:
    def __init__(self, ptr: int, nbytes: int) -> None:
        self.data = type("P", (), {"ptr": ptr})()
        self.nbytes = nbytes


def _ahead() -> tuple:
    """out_proj, gate and up of 4 KB codes each, scales and biases carved after them."""
    ws = []
    for base in (1 << 20, 1 << 24, 1 << 25):
        parts = (_Dev(base, 4096), _Dev(base + 4096, 512), _Dev(base + 4608, 512))
        ws.append(QWeight(*parts, 4, 64, (64, 512)))
    return tuple(ws)


@pytest.mark.parametrize("capability", sorted(GATES))
def test_each_hopper_path_runs_where_its_gate_says(monkeypatch, capability):
    pdl, cluster, prefetch = GATES[capability]
    assert (runs_pdl(capability), runs_cluster_split(capability)) == (pdl, cluster)
    assert runs_bulk_prefetch(capability) == prefetch
    use_card(monkeypatch, Card(capability, 84, 64 << 20, 99 * 1024))
    assert launch.pdl_available() == pdl
    kernels = launch.Kernels("float16")  # asks the (patched) device, as a backend does
    assert (kernels.pdl, kernels.prefetch) == (pdl, prefetch)

    launches = []
    monkeypatch.setattr(kernels, "run", lambda *a, **kw: launches.append(a))
    dn = DeltaNet(kernels, None, None, None, Tuning())
    dims = (16, 32, 128, 128, 4)  # the 4B's DeltaNet heads
    assert (dn.split_shape(*dims[:4]) is not None) == cluster
    dn.step(*(DeviceArray((1, 8)),) * 8, (DeviceArray((1,)),) * 3, 1, None, dims, ahead=_ahead())
    _, sym, grid, block, args = launches[-1]
    if cluster:
        assert (sym, grid, block) == ("gdn_step_split<4,4>", (64, 1), (512,))
    else:
        assert (sym, grid, block) == ("gdn_step<8>", (16, 1), (1024,))
    spans = [int(a) for a in args[-6:]]
    assert (spans != [0] * 6) == prefetch  # null spans: nothing brought toward L2
    assert all(isinstance(a, np.integer) for a in args[-6:])


def test_overlap_stays_off_when_the_settings_say_so(monkeypatch):
    use_card(monkeypatch, Card(120, 170, 96 << 20, 99 * 1024))
    assert not launch.Kernels("bfloat16", overlap=False).pdl
    monkeypatch.setattr(launch, "_driver_launch", lambda: None)  # a driver without the call
    assert not launch.Kernels("bfloat16").pdl


def test_a_tuning_without_the_cluster_step_runs_one_block_on_hopper(monkeypatch):
    use_card(monkeypatch, Card(90, 132, 60 << 20, 227 * 1024))
    dn = DeltaNet(launch.Kernels("bfloat16"), None, None, None, Tuning(deltanet_step_blocks=0))
    assert dn.split_shape(16, 32, 128, 128) is None


@pytest.mark.parametrize(
    "dtype,capability,smem,want",
    [
        ("bfloat16", 90, 232_448, "attn_prefill<256,4,2>"),
        ("float16", 86, 101_376, "attn_prefill<256,4,2>"),  # 99 KiB holds two tiles at 256
        ("bfloat16", 86, 100_000, "attn_prefill<256,4,1>"),  # a little less: one
        ("bfloat16", 120, 49_152, ""),  # not even one tile: the unfused products
        ("float16", 75, 65_536, ""),  # no bf16 tensor cores or cp.async before sm_80
        ("float32", 90, 232_448, ""),  # fp32 keeps the unfused products (exact tests)
    ],
)
def test_fused_prefill_attention_is_chosen_where_it_runs(dtype, capability, smem, want):
    from engine.backends.cuda.attention import prefill_kernel, prefill_smem

    sym, need = prefill_kernel(256, dtype, capability, smem)
    assert sym == want
    assert (need <= smem) if sym else need == 0
    assert prefill_smem(256, 2) == 101_376 and prefill_smem(64, 2) == 27_648
