"""A fresh engine's first requests compile, load, tune, capture and create nothing: warm-up
did all of it (invariant 4; engine/backends/cuda/warmup.py).

After `Engine.load`, every module CuPy makes is counted through CuPy's one entry point for
compiling or loading one (Snug's kernels and CuPy's own copies and fills alike), beside
Snug's own count (`modules.built`), the process's cuBLAS handles, the decode graphs
captured and the projection choices tuned. Then the first requests of each kind run: an
8K-token chat prompt sampled with the app's settings (the reply's steps launched ahead,
drawn on the device with a presence penalty), a greedy one, the chat's next turn (resumed
from the saved state), and two concurrent requests with the server's defaults through the
scheduler, on its own thread. None of them may make anything. Each kind then runs again on
a fresh prompt, and the first request's time over the second's is printed (no bar here:
docs/benchmarks.md reports the figures).

The tiny model's vocabulary is below the split draw's threshold, so the engine here draws
with a threshold below it (`SPLIT_AT`): the app's top-k 20 then takes the split draw, as it
does over Qwen3.5's real vocabulary.

    pytest -s tests/device/test_warmup.py
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
import traceback

import numpy as np
import pytest

from engine.backends.cuda import backend as cuda_backend
from engine.backends.cuda import blas, modules
from engine.backends.cuda.catalog import extern_kernels
from engine.backends.cuda.tuning import Tuning
from engine.config import EngineSettings
from engine.scheduler import Scheduler
from engine.session import Engine, GenerationParams

CONTEXT, PROMPT, NEW = 8192, 8000, 48
SPLIT_AT = 256  # split draws from this many real ids (the tiny tokenizer has about 400)
# The chat's sampling as the app ships it (app/state/settings.py, which
# tests/engine/test_warmup_plan.py reads), and a server request that sets nothing.
APP = GenerationParams(
    max_new_tokens=NEW, temperature=0.7, top_k=20, top_p=0.8, presence_penalty=1.5
)
SERVER = GenerationParams(max_new_tokens=NEW)
GREEDY = GenerationParams(max_new_tokens=NEW, greedy=True)
_PROBES = itertools.count()
_KERNEL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random MLX 4-bit checkpoint with the tiny tokenizer and chat template."""
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("warm") / "tiny", "tiny", "mlx4", seed=7)
    write_tokenizer(path)
    return path


class Builds:
    """Every module CuPy makes from now on, compiled by NVRTC or loaded from its cache on
    disk: `made` holds each one's name expressions and first kernels, then the engine's
    innermost calls that asked for it (so a failure says where)."""

    def __init__(self, monkeypatch) -> None:
        from cupy.cuda import compiler

        self.made: list[list[str]] = []
        real = compiler._compile_module_with_cache

        def counted(source, *args, **kwargs):
            names = list(kwargs.get("name_expressions") or ())
            calls = [
                f"{f.filename.split('/engine/')[-1]}:{f.lineno} {f.name}"
                for f in traceback.extract_stack()
                if "/engine/" in f.filename
            ]
            self.made.append(names + _KERNEL.findall(source)[:4] + calls[-4:])
            return real(source, *args, **kwargs)

        monkeypatch.setattr(compiler, "_compile_module_with_cache", counted)

    def probe(self, dtype: str) -> None:
        """Make one module now (a define no kernel reads gives it a key of its own, and CuPy
        keeps a module for the process): the count must see it, or it sees nothing."""
        import cupy

        before = len(self.made)
        opts = modules.options(dtype, (f"SNUG_BUILD_PROBE={next(_PROBES)}",))
        cupy.RawModule(code=modules.source("norm.cu"), options=opts).get_function(
            extern_kernels("norm.cu")[0]
        )
        assert len(self.made) == before + 1, "CuPy made a module the count did not see"


def chat_prompt(engine, n: int, seed: int) -> list[int]:
    """`n` ids: random text ids, then a user turn and the generation prompt (its turn start
    cuts the prefill's last window, as a chat's does)."""
    tail = engine.chat_ids([{"role": "user", "content": "Hi"}])
    rng = np.random.default_rng(seed)
    return rng.integers(0, 400, size=n - len(tail)).tolist() + tail


def reply(engine, ids, params) -> tuple[list[int], float, object]:
    t = time.perf_counter()
    events = list(engine.generate(ids, params))
    return [e.token_id for e in events], time.perf_counter() - t, events[-1].stats


def served(scheduler, prompts, params) -> tuple[list[list[int]], float]:
    """The prompts as concurrent requests through the scheduler (its own thread)."""
    out: list = [None] * len(prompts)

    def run(i):
        out[i] = [e.token_id for e in scheduler.generate(prompts[i], params)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(out), out  # each request replied
    return out, time.perf_counter() - t


def rounds(engine, scheduler, seed: int) -> dict[str, tuple]:
    """One request of each kind on fresh prompts: (tokens, seconds, stats)."""
    ids = chat_prompt(engine, PROMPT, seed)
    sampled = reply(engine, ids, APP)
    greedy = reply(engine, chat_prompt(engine, PROMPT, seed + 1), GREEDY)
    follow = ids + sampled[0] + chat_prompt(engine, 40, seed + 2)
    resumed = reply(engine, follow, APP)
    pair = [chat_prompt(engine, PROMPT // 2 + 100 * i, seed + 3 + i) for i in range(2)]
    server = served(scheduler, pair, SERVER)
    return {"sampled": sampled, "greedy": greedy, "resumed": resumed, "server": (*server, None)}


@pytest.mark.parametrize("eager", [None, False], ids=["planned", "lazy"])
def test_first_requests_make_nothing_warm_up_did_not(model_dir, monkeypatch, eager):
    monkeypatch.setattr(
        cuda_backend, "Tuning", functools.partial(Tuning, split_draw_min_vocab=SPLIT_AT)
    )
    settings = EngineSettings(backend="cuda")
    engine = Engine.load(model_dir, settings, context=CONTEXT, streams=2, eager=eager)
    be = engine.backend
    assert engine.vocab_rows >= SPLIT_AT and be.tuning.split_draw_min_vocab == SPLIT_AT
    eager_path = engine.decision.eager if eager is None else eager
    builds = Builds(monkeypatch)
    made0, handles0 = modules.built(), blas.handles()
    captures0, tuned0 = be.graphs.captures, dict(be.projections.tuner.choice)
    scheduler = Scheduler(engine).start()
    try:
        first = rounds(engine, scheduler, seed=1)
        assert builds.made == [], f"modules made by the first requests: {builds.made}"
        assert modules.built() == made0
        assert blas.handles() == handles0 and len(handles0) == 1  # warm-up's, on any thread
        assert be.projections.tuner.choice == tuned0  # every row count tuned at warm-up
        if eager_path:  # the lazy path captures again after a prompt grows its scratch
            assert be.graphs.captures == captures0
        second = rounds(engine, scheduler, seed=11)
        assert builds.made == [] and modules.built() == made0
    finally:
        scheduler.close()
    builds.probe(be.dtype)
    print(f"\n[warm-up, {'eager' if eager_path else 'lazy'}] first request / second, same kind:")
    for kind in first:
        (t1, s1, st1), (t2, s2, st2) = first[kind][:3], second[kind][:3]
        assert len(t1) > 0 and len(t2) > 0
        line = f"  {kind:8s} {s1:.3f} s / {s2:.3f} s = {s1 / s2:.3f}"
        if st1 is not None:
            line += (
                f"; TTFT {st1.ttft_s:.3f} / {st2.ttft_s:.3f} s, decode "
                f"{st1.decode_tok_s:.0f} / {st2.decode_tok_s:.0f} tok/s"
            )
        print(line)
    engine.unload()


def test_a_load_compiles_on_its_threads_every_program_warm_up_meets(model_dir, monkeypatch):
    """Every program of Snug's that the load's warm-up meets was made by the compile
    threads (prebuild.py) under the key warm-up asks with: once the threads are done, the
    loading thread makes none of Snug's programs (CuPy's memo of the process's modules hands
    warm-up the threads' ones; a key that differed would compile or read the program again,
    one after another). What the upload asks for while the threads still run is theirs
    too, with the same key."""
    from cupy import _util as cupy_util
    from cupy.cuda import compiler

    from engine.backends.cuda.catalog import FILES
    from engine.backends.cuda.prebuild import Prebuild

    ours = {modules.source(f) for f in (*FILES, "gemv4.cu")}
    threads: set[tuple] = set()
    upload: list[tuple] = []  # asked for on the loading thread while the threads ran
    after: list[tuple] = []  # ... once they were done
    done = threading.Event()
    real, real_wait = compiler._compile_module_with_cache, Prebuild.wait

    def keyed(source, options, *args, **kwargs):
        if source in ours:
            names = tuple(sorted(kwargs.get("name_expressions") or ()))
            key = (source, tuple(options), names)
            if threading.current_thread().name.startswith("snug-compile"):
                threads.add(key)
            else:
                (after if done.is_set() else upload).append(key)
        return real(source, options, *args, **kwargs)

    def waited(self, report=None):
        real_wait(self, report)
        done.set()

    monkeypatch.setattr(compiler, "_compile_module_with_cache", keyed)
    monkeypatch.setattr(Prebuild, "wait", waited)
    # CuPy's memo of this process's modules forgets those earlier tests made (the same
    # model's programs): the threads then make them again, as in a fresh process.
    cupy_util.clear_memo()
    made0 = modules.built()
    engine = Engine.load(model_dir, EngineSettings(backend="cuda"), context=CONTEXT, streams=2)
    try:
        assert done.is_set() and threads
        assert modules.built() > made0  # warm-up asked for modules: it took the threads'
        names = [(k[2][:2], [o for o in k[1] if o.startswith("-D")]) for k in after]
        assert names == [], f"asked for on the loading thread after the threads: {names}"
        missed = [k[2][:2] for k in upload if k not in threads]
        assert missed == [], f"asked for by the upload, not by the threads: {missed}"
        print(
            f"\n[prebuild] {len(threads)} programs on the threads, {len(upload)} also by the upload"
        )
    finally:
        engine.unload()
