"""What a GPU is, as the CUDA backend's choices read it: `Card` (one frozen value a device,
asked once by `launch.card()`), the architecture gates, one a feature, and the NVRTC release
each architecture needs.

Everything here is pure: nothing starts CUDA, so the kernel catalog (catalog.py), the load
checks (support.py) and the tests work with any card, not just the one in the machine.

Each gate says which compute capabilities run a feature and why:

    feature                       runs on             kernels / module
    tensor-core projection        8.0 and newer       gemv4.cu (mma.m16n8k16, cp.async)
    bf16 activations              8.0 and newer       cvt.rn.bf16.f32 (common.cuh)
    programmatic dependent launch 9.0 and newer       griddepcontrol (common.cuh), launch.py
    DeltaNet step over a cluster  9.0, 10.0, 10.3     gdn_step_split (gdn.cu), deltanet.py
    bulk L2 prefetch of weights   9.0, 10.0, 10.3     prefetch_ahead (common.cuh), launch.py
"""

from __future__ import annotations

from dataclasses import dataclass

# The oldest architecture the kernels are compiled and tested for (tests/engine/
# test_nvrtc_archs.py): Turing, sm_75 (GTX 16xx, RTX 20xx). Older cards are refused at load.
MIN_CAPABILITY = 75


@dataclass(frozen=True)
class Card:
    """The properties launch geometry reads. `smem_per_block` is what one block may opt in
    to (cudaDevAttrMaxSharedMemoryPerBlockOptin: static and dynamic together): 227 KiB on
    sm_90, 163 KiB on sm_80, 99 KiB on sm_86/89/120, 64 KiB on sm_75."""

    capability: int  # major * 10 + minor: 90 on an H200
    sm_count: int
    l2_bytes: int
    smem_per_block: int

    @property
    def arch(self) -> str:
        """The NVRTC architecture of this card's machine code, e.g. "sm_90"."""
        return f"sm_{self.capability}"


MIB = 1 << 20
# One part of each tested architecture, as its properties read: the CI compile lists the
# catalog for these (the opt-in shared memory is the architecture's), and CPU tests of the
# backend's choices use them.
ARCH_CARDS = {
    75: Card(75, 46, 4 * MIB, 64 * 1024),  # RTX 2080
    80: Card(80, 108, 40 * MIB, 163 * 1024),  # A100
    86: Card(86, 20, 2 * MIB, 99 * 1024),  # RTX 3050
    89: Card(89, 128, 72 * MIB, 99 * 1024),  # RTX 4090
    90: Card(90, 132, 60 * MIB, 227 * 1024),  # H200
    120: Card(120, 170, 96 * MIB, 99 * 1024),  # RTX 5090
}


def runs_mma(capability: int) -> bool:
    """gemv4's mma.m16n8k16 on bf16/fp16 and its cp.async staging need sm_80; older cards
    run the SIMT gemv and separate norm kernels."""
    return capability >= 80


def runs_bf16(capability: int) -> bool:
    """bf16 activations: common.cuh rounds with cvt.rn.bf16.f32, a PTX instruction of sm_80
    and newer. Older cards compute in fp16."""
    return capability >= 80


def runs_pdl(capability: int) -> bool:
    """Programmatic dependent launch: griddepcontrol and the launch attribute are defined for
    every architecture from 9.0 on, the consumer Blackwell parts (sm_120/121) included, and a
    kernel launched without the attribute computes the same values. Kept on for all of
    them: the gate only decides whether kernel boundaries may overlap."""
    return capability >= 90


# The data-centre parts whose thread block clusters and bulk copy unit the cluster step and
# the bulk prefetch were measured on (sm_90) or share that design with (sm_100, sm_103:
# B200, B300). Consumer Blackwell (sm_120, sm_121) has clusters and cp.async.bulk too, but
# neither path was timed there, and its bulk copy unit is reported slower than sm_100's.
_DATA_CENTRE = frozenset({90, 100, 103})


def runs_cluster_split(capability: int) -> bool:
    """gdn_step_split (a cluster of blocks a key head) on the data-centre parts only. It
    won on the H200, where one block a key head leaves most of 132 SMs idle; on sm_120 the
    one-block step (what every card before Hopper runs) stays until the split is measured
    there (tools/bench_decode.py with Tuning(deltanet_step_blocks=0) against 4)."""
    return capability in _DATA_CENTRE


def runs_bulk_prefetch(capability: int) -> bool:
    """cp.async.bulk.prefetch.L2 of the weights read next, issued by the DeltaNet step and
    attn_prep, on the data-centre parts only (measured with an H200's HBM and 60 MB L2).
    Elsewhere the launches pass null spans; below sm_90 the kernels compile it out."""
    return capability in _DATA_CENTRE


# The first NVRTC release with which CuPy compiles every kernel for a card of this compute
# capability: the release that added the architecture; for sm_90, CUDA 12.0, whose PTX ISA
# 8.0 has the cp.async.bulk.prefetch that common.cuh compiles there; for sm_121, 12.8, whose
# sm_120 machine code it runs (CuPy compiles for the newest architecture NVRTC knows).
NVRTC_NEEDED = {
    75: (10, 0),
    80: (11, 0),
    86: (11, 1),
    87: (11, 4),
    89: (11, 8),
    90: (12, 0),
    100: (12, 8),
    101: (12, 8),
    103: (12, 9),
    110: (13, 0),
    120: (12, 8),
    121: (12, 8),
}


def nvrtc_needed(capability: int) -> tuple[int, int] | None:
    """The NVRTC version (major, minor) the kernels need for this architecture; None where
    the table does not know it (then NVRTC's own list of architectures decides)."""
    return NVRTC_NEEDED.get(capability)
