"""A load's kernels compiled on worker threads (engine/backends/cuda/prebuild.py), without a
GPU: its programs are the ones the backend asks CuPy for, key for key (or warm-up would
compile them again), and the workers report, survive a failing program and stop when told."""

from __future__ import annotations

import threading

import pytest

from engine.backends.cuda import modules, prebuild
from engine.backends.cuda.card import ARCH_CARDS
from engine.backends.cuda.catalog import extern_kernels, requests
from engine.backends.cuda.catalog import modules as catalog_modules
from engine.backends.cuda.gemv_plan import GEMV4_VARIANTS, GEMV_MAX_ROWS, gemv4_module
from engine.backends.cuda.projections import Projections
from engine.memory.shapes import shape_config, shape_tensor_specs
from tests.engine.cuda_fakes import Fn, RecordingKernels


class Programs:
    """cupy.RawModule and cupy.cuda.Device replaced: each program made is recorded by what
    CuPy keys its disk cache on (source, options, sorted name expressions)."""

    def __init__(self, monkeypatch) -> None:
        import cupy

        self.made: list[tuple] = []
        made = self.made

        class RawModule:
            def __init__(self, code, options=(), name_expressions=None):
                made.append((code, tuple(options), tuple(sorted(name_expressions or ()))))

            def get_function(self, name):
                return Fn(name)

            def compile(self):
                pass

        class Device:
            def __init__(self, device=None):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        monkeypatch.setattr(cupy, "RawModule", RawModule)
        monkeypatch.setattr(cupy.cuda, "Device", Device)


class CheckedKernels(RecordingKernels):
    def check(self, file, symbols) -> None:
        pass


def ask_like_the_backend(proj: Projections, mods) -> None:
    """The backend's own requests for the catalog `mods`: every gemv4 module through
    Projections, every other kernel through modules.function (uncached here)."""
    listed = {m.names for m in mods if m.file == "gemv4.cu"}
    for rows in range(1, GEMV_MAX_ROWS + 1):
        for swiglu in (False, True):
            for kind in range(8):
                if tuple(gemv4_module(rows, swiglu, kind)) in listed:
                    proj.gemv4_kernel(rows, swiglu, GEMV4_VARIANTS[0], kind)
    for file, symbol in sorted(requests(mods)):
        if file != "gemv4.cu":
            modules.function.__wrapped__(file, symbol, "bfloat16")


@pytest.mark.parametrize("size", ["0.8B", "4B"])
@pytest.mark.parametrize("invariant", [False, True])
def test_the_prebuilt_programs_are_the_ones_the_backend_asks_for(monkeypatch, size, invariant):
    config = shape_config(size, "mlx4")
    mods = catalog_modules(config, shape_tensor_specs(config, "mlx4"), "bfloat16", ARCH_CARDS[89])
    programs = Programs(monkeypatch)
    proj = Projections(CheckedKernels(), invariant=invariant)
    ask_like_the_backend(proj, mods)
    asked = set(programs.made)  # a file's extern "C" kernels are one program, asked for each
    programs.made.clear()

    jobs = prebuild.jobs(mods, proj.gemv4_compile_defines, extern_kernels)
    for job in jobs:
        prebuild.compile_job(job, "bfloat16", 0)
    assert len(programs.made) == len(jobs)  # no program twice
    assert set(programs.made) == asked
    assert jobs[0].file == "gemv4.cu"  # the longest compiles go first
    assert any("SNUG_BATCH_INVARIANT" in " ".join(p[1]) for p in asked) == invariant


def test_workers_report_each_program_and_keep_going_past_a_failure():
    ran, names = [], set()

    def run(job, dtype, device):
        names.add(threading.current_thread().name)
        if job.file == "bad.cu":
            raise RuntimeError("NVRTC said no")
        ran.append((job.file, dtype, device))

    jobs = [prebuild.Job(f"k{i}.cu") for i in range(6)] + [prebuild.Job("bad.cu")]
    build = prebuild.Prebuild(jobs, "float16", 3, workers=3, run=run).start()
    reports = []
    build.wait(lambda done, total: reports.append((done, total)))
    assert reports == [(i, 7) for i in range(1, 8)]
    assert sorted(ran) == sorted((f"k{i}.cu", "float16", 3) for i in range(6))
    assert [(j.file, str(e)) for j, e in build.failed] == [("bad.cu", "NVRTC said no")]
    assert all(n.startswith("snug-compile") for n in names)
    build.wait()  # a second wait returns at once


def test_cancel_drops_the_programs_not_started():
    gate, started = threading.Event(), []

    def run(job, dtype, device):
        started.append(job.file)
        gate.wait(5)

    jobs = [prebuild.Job(f"k{i}.cu") for i in range(20)]
    build = prebuild.Prebuild(jobs, "bfloat16", 0, workers=2, run=run).start()
    while len(started) < 2:
        threading.Event().wait(0.01)
    build.cancel()
    gate.set()
    build.wait()  # nothing left to wait for
    assert len(started) == 2


def test_threads_leave_a_core_to_the_upload(monkeypatch):
    for cores, expected in ((1, 1), (2, 1), (4, 3), (16, prebuild.MAX_THREADS), (None, 1)):
        monkeypatch.setattr(prebuild.os, "cpu_count", lambda c=cores: c)
        assert prebuild.threads() == expected


@pytest.mark.parametrize("size", ["0.8B", "4B", "9B"])
def test_a_load_compiles_only_what_its_setting_meets(size):
    """Out of batch-invariant mode, the SwiGLU launch without its add + norm (norm_mlp's
    fallback where pro_ok refuses) is left to compile on request wherever the prologue fits,
    and attention keeps that setting's instances only; the rest is the catalog's list."""
    config = shape_config(size, "mlx4")
    specs = shape_tensor_specs(config, "mlx4")
    card = ARCH_CARDS[89]

    def listed(**kw):
        return {
            (m.file, n)
            for m in catalog_modules(config, specs, "bfloat16", card, **kw)
            for n in m.names
        }

    every, plain, invariant = listed(), listed(invariant=False), listed(invariant=True)
    assert plain < every and invariant <= every
    dropped = every - plain
    swiglu_alone = {
        ("gemv4.cu", n) for rows in range(1, GEMV_MAX_ROWS + 1) for n in gemv4_module(rows, True, 0)
    }
    assert dropped - swiglu_alone <= {(f, n) for f, n in every if f == "attention.cu"}
    assert swiglu_alone <= dropped  # every row count: the prologue fits at each on sm_89
    assert swiglu_alone <= invariant  # batch-invariant mode keeps its fallbacks
    # Each attention instance is one setting's or the other's.
    attention = {n for f, n in every if f == "attention.cu"}
    assert {n for f, n in plain | invariant if f == "attention.cu"} == attention
