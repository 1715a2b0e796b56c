"""Every kernel instance the backend can request compiles for every card CI has none of.

The instances are the engine's own list (engine/backends/cuda/catalog.py: the functions that
pick them at run time, walked over the four Qwen3.5 sizes in MLX 4-bit and bf16, with the KV
cache in bf16 and in 8 bits), compiled
with NVRTC for an explicit architecture (`-arch=sm_XX`) in each precision the architecture
runs: bf16 from sm_80, fp16 and fp32 everywhere. Each distinct (file, instances, options,
architecture) is one NVRTC program, compiled once a session, on threads in parallel.

Always on: every architecture in its first precision (bf16; fp16 on sm_75), with the
one-row projections, plus sm_86 in all three precisions. The whole matrix (every row count,
precision and architecture) is slow: SNUG_NVRTC_MATRIX=1 runs it.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.backends.cuda.card import ARCH_CARDS, runs_bf16
from engine.backends.cuda.catalog import Module, modules
from engine.memory.shapes import FORMATS, SHAPES, shape_config, shape_tensor_specs

pytest.importorskip("cuda.pathfinder")
nvrtc = pytest.importorskip("engine.backends.cuda.nvrtc")

ARCHS = tuple(ARCH_CARDS)  # sm_75, 80, 86, 89, 90, 120
FULL = os.environ.get("SNUG_NVRTC_MATRIX") == "1"


def dtypes(capability: int) -> tuple[str, ...]:
    """The precisions a card runs: bf16 needs sm_80."""
    if runs_bf16(capability):
        return ("bfloat16", "float16", "float32")
    return ("float16", "float32")


@functools.cache
def programs(capability: int, dtype: str) -> tuple[Module, ...]:
    """The catalog of every size and format on the reference card of this architecture, as
    NVRTC programs: gemv4 one a module (as the backend compiles it), every other file one
    program holding all its instances."""
    card = ARCH_CARDS[capability]
    gemv4: set[Module] = set()
    files: dict[str, set[str]] = {}
    for size in SHAPES:
        for fmt, kv in [(f, kv) for f in FORMATS for kv in ("bf16", "int8")]:
            config = shape_config(size, fmt)
            for m in modules(config, shape_tensor_specs(config, fmt), dtype, card, kv_cache=kv):
                if m.file == "gemv4.cu":
                    gemv4.add(m)
                else:
                    files.setdefault(m.file, set()).update(m.names)
    rest = [Module(f, tuple(sorted(names))) for f, names in sorted(files.items())]
    return tuple(sorted(gemv4, key=lambda m: m.names)) + tuple(rest)


def one_row(m: Module) -> Module | None:
    """The part of a program that runs at one row: gemv4 modules of one row, the SIMT
    kernel's one-row instances, everything else whole."""
    if m.file == "gemv4.cu":
        return m if m.names[0].startswith("gemv4<1,") else None
    if m.file == "gemv.cu":
        return Module(m.file, tuple(n for n in m.names if n.split(",")[1] == "1"))
    return m


@functools.cache
def compiled(m: Module, dtype: str, arch: str) -> float:
    """Seconds NVRTC took for this program (raises with its log where it fails)."""
    t = time.perf_counter()
    cubin = nvrtc.compile_module(m.file, m.names, dtype, arch, m.defines)
    assert cubin[:4] == b"\x7fELF", (m.file, arch)
    return time.perf_counter() - t


def compile_all(jobs: list[tuple[Module, str, int]]) -> float:
    """Compile every (program, dtype, capability) once, in parallel; NVRTC seconds in all."""
    unique = list(dict.fromkeys(jobs))
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        return sum(pool.map(lambda j: compiled(j[0], j[1], f"sm_{j[2]}"), unique))


def _arch_ok(capability: int) -> None:
    if capability not in nvrtc.supported_archs():
        version = ".".join(map(str, nvrtc.loaded_version()))
        pytest.skip(f"NVRTC {version} does not compile for sm_{capability}")


@pytest.mark.parametrize("capability", ARCHS)
def test_one_row_instances_compile_for_each_architecture(capability):
    _arch_ok(capability)
    dtype = dtypes(capability)[0]
    jobs = [(m, dtype, capability) for p in programs(capability, dtype) if (m := one_row(p))]
    if capability == 86:  # every precision, on one architecture
        jobs += [
            (m, dt, 86) for dt in dtypes(86)[1:] for p in programs(86, dt) if (m := one_row(p))
        ]
    assert jobs
    compile_all(jobs)


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="the whole matrix: set SNUG_NVRTC_MATRIX=1")
@pytest.mark.parametrize("capability", ARCHS)
def test_every_instance_compiles_for_each_architecture(capability):
    _arch_ok(capability)
    compile_all(
        [(m, dt, capability) for dt in dtypes(capability) for m in programs(capability, dt)]
    )


def test_the_catalog_follows_the_card():
    """What each architecture's catalog holds: the tensor-core projection from sm_80, the
    DeltaNet cluster step only on the data-centre parts, 64-row chunks where a block may
    take 134 KB (32-row chunks on tensor cores from sm_80 unless the model computes in
    fp32), and the decode attention's 8-warp form where the grid can fit the SMs."""

    def names(capability, dtype="float16", fmt="mlx4"):
        config = shape_config("4B", fmt)
        mods = modules(config, shape_tensor_specs(config, fmt), dtype, ARCH_CARDS[capability])
        return {(m.file, n) for m in mods for n in m.names}

    assert not any(f == "gemv4.cu" for f, _ in names(75))
    assert ("gemv.cu", "gemv<4,1,1,false,4>") in names(75)
    assert any(f == "gemv4.cu" for f, _ in names(80))
    assert not any(f == "gemv4.cu" for f, _ in names(90, "float32"))
    assert ("gdn.cu", "gdn_step_split<4,4>") in names(90)
    assert ("gdn.cu", "gdn_step<8>") in names(120)
    # a drafting verify (the bf16 checkpoint keeps the MTP head) runs the step's own split
    assert ("gdn.cu", "gdn_step_split_keep<4,4>") in names(90, "bfloat16", "bf16")
    assert ("gdn.cu", "gdn_step_keep<8>") in names(120, "bfloat16", "bf16")
    assert not any("keep" in n for _, n in names(90))  # MLX conversions drop the head
    assert not any("split" in n for _, n in names(120))
    assert ("gdn_chunk.cu", "gdn_chunk<64>") in names(80, "float32")
    assert ("gdn_chunk_tc.cu", "gdn_chunk_tc<32>") in names(90)
    assert ("gdn_chunk_tc.cu", "gdn_chunk_tc<32>") in names(86)
    assert ("gdn_chunk.cu", "gdn_chunk<32>") in names(86, "float32")
    assert ("gdn_chunk.cu", "gdn_chunk<16>") in names(75)
    attn = {n for f, n in names(86) if f == "attention.cu"}
    assert attn == {"attn_decode<8,4,4,4>", "attn_decode<8,4,4,8>"}
    assert all(
        ("gemv4.cu", f"gemv4<{r},false,2,2,true,256,0,false>") in names(86) for r in range(1, 9)
    )


def test_the_full_matrix_is_counted():
    """The instance count per architecture (printed with -s): what the slow test compiles."""
    for capability in ARCHS:
        count = {
            dt: sum(len(m.names) for m in programs(capability, dt)) for dt in dtypes(capability)
        }
        print(f"sm_{capability}: {count}")
        assert all(n > 0 for n in count.values())
