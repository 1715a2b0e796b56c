"""A model's kernels compiled on worker threads while its weights upload.

On a machine whose kernel cache (CuPy's: CUPY_CACHE_DIR, see README.md) does not hold
them yet, the first load of a model compiles every kernel its requests can use, nearly all
of the time in the `gemv4` modules (2 to 3 s each: one per row count, SwiGLU and
prologue). Warm-up compiled them one after another: the 4B's first load took 138 s on the
H200's 16-core machine (43 programs, 131 s of them compiling), its next one 7 s, and the
user watched "warming up" for two minutes (docs/benchmarks.md, "The first load on a
machine").

`Prebuild` hands the same programs, as the backend will ask CuPy for them, to a few
threads as soon as the catalog (catalog.py) is known, before the weights upload: the
programs a load with this setting meets (the 4B's 50; `catalog.modules` with `invariant`).
NVRTC runs without the GIL, so they compile side by side and beside the upload (188 s of
compiling in 21 s on 8 threads, when the catalog's superset of 58 compiled); each lands in
CuPy's disk cache and in its memo of the process's modules (one a device), where warm-up's
own request then finds it without reading the disk again. Nothing here replaces that
request: a program that fails to compile here is compiled again there, where its error
reaches the caller. With the cache already filled, each job only reads a file.

CuPy keys its cache by the source, options, architecture and (sorted) name expressions, and
its memo by the name expressions in their order, so a job must ask exactly as the backend
will: a `gemv4` module whole with its defines (`Projections.gemv4_kernel`), every other
template instance alone and each file's extern "C" kernels once (`modules.function`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from engine.backends.cuda.modules import options, source

MAX_THREADS = 8


@dataclass(frozen=True)
class Job:
    """One CuPy program: `kernels/<file>` with `names` as its name expressions (none: the
    file's extern "C" kernels) and extra `-D` flags `defines`."""

    file: str
    names: tuple[str, ...] = ()
    defines: tuple[str, ...] = ()


def jobs(modules: Iterable[Any], gemv4_defines: tuple[str, ...], externs) -> list[Job]:
    """The programs the backend will compile for catalog `modules` (catalog.Module), the
    longest first: each gemv4 module whole, with `gemv4_defines`; every other template
    instance alone; once per file, its extern "C" kernels where `externs(file)` has any."""
    gemv4, rest, files = [], [], []
    for m in modules:
        if m.file == "gemv4.cu":
            gemv4.append(Job(m.file, tuple(m.names), tuple(gemv4_defines)))
            continue
        rest += [Job(m.file, (name,)) for name in m.names if "<" in name]
        if m.file not in files and externs(m.file):
            files.append(m.file)
    return list(dict.fromkeys(gemv4 + rest + [Job(f) for f in files]))


def threads() -> int:
    """Workers for the compiles: one core left to the upload, at most MAX_THREADS."""
    return max(1, min(MAX_THREADS, (os.cpu_count() or 2) - 1))


def compile_job(job: Job, dtype: str, device: int) -> None:
    """Compile (or read from the disk cache) one program for `device`'s architecture."""
    import cupy

    with cupy.cuda.Device(device):
        names = list(job.names) or None
        cupy.RawModule(
            code=source(job.file), options=options(dtype, job.defines), name_expressions=names
        ).compile()


class Prebuild:
    """`jobs` compiled on `workers` threads from `start` on; `wait` until they are done."""

    def __init__(
        self,
        jobs: list[Job],
        dtype: str,
        device: int,
        workers: int,
        run: Callable[[Job, str, int], None] = compile_job,
    ) -> None:
        self.jobs, self.dtype, self.device, self.workers = jobs, dtype, device, workers
        self._run = run
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future] = []
        self.failed: list[tuple[Job, BaseException]] = []  # compiled again by warm-up

    def start(self) -> Prebuild:
        if self.jobs and self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="snug-compile")
            self._futures = [self._pool.submit(self._one, job) for job in self.jobs]
        return self

    def _one(self, job: Job) -> None:
        try:
            self._run(job, self.dtype, self.device)
        except Exception as exc:  # warm-up compiles it again and raises there
            self.failed.append((job, exc))  # list.append: one step under the GIL

    def wait(self, report: Callable[[int, int], None] | None = None) -> None:
        """Block until every job has run, calling `report(done, total)` as they finish."""
        if self._pool is None:
            return
        total = len(self._futures)
        for done, _ in enumerate(as_completed(self._futures), 1):
            if report is not None:
                report(done, total)
        self._pool.shutdown(wait=True)
        self._pool = None

    def cancel(self) -> None:
        """Drop the jobs not yet started (a failed or released load); running ones finish."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
