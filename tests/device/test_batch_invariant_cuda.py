"""Batch-invariant decode on the GPU (EngineSettings.batch_invariant), in the default
precision (bf16): a stream served beside others gets the tokens and the logits, bit for bit,
that it gets alone. Requests join the scheduler at different steps (their prompts prefilled
a window at a time between the others' steps) and leave at different steps, so every row
is decoded at several batch sizes. Run with -s for the timing lines: the one-stream step
with the mode on and off, whose cost docs/benchmarks.md reports."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.config import EngineSettings
from engine.scheduler import Scheduler
from engine.server.cli import with_batch_invariant
from engine.session import Engine, GenerationParams

LENGTHS = (5, 150, 40, 90, 7, 130, 33, 64)  # prompts of one to three 64-row windows
JOINS = (0, 2, 3, 7, 8, 12, 13, 17)  # the scheduler iteration each request arrives at


def bf16(invariant: bool) -> EngineSettings:
    return EngineSettings(backend="cuda", compute_dtype="bfloat16", batch_invariant=invariant)


def prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 400, size=n).tolist()


class Recording(Scheduler):
    """The scheduler with every logit row it picks from kept (greedy on the host), and the
    size of every decode step. Those rows exist where the host waits for each step, so its
    steps are not launched ahead unless `ahead` (then the picks are made on the device and
    only the tokens are kept)."""

    def __init__(self, engine: Engine, ahead: bool = False) -> None:
        super().__init__(engine, queue_size=16)
        self.logits: dict[int, list[np.ndarray]] = {}
        self.sizes: list[int] = []
        self.ahead = ahead

    def _launcher(self, batch):
        return super()._launcher(batch) if self.ahead else None

    def _pick(self, request, row: np.ndarray) -> int:
        self.logits.setdefault(request.id, []).append(np.array(row, np.float32))
        return int(np.argmax(row[: self.engine.vocab_rows]))

    def _first_token(self, request, logits) -> int:
        return self._pick(request, logits)

    def _next_tokens(self, batch) -> list[int]:
        self.sizes.append(len(batch))
        rows = self.engine.step([r.stream for r in batch], [r.next_token for r in batch])
        return [self._pick(r, row) for r, row in zip(batch, rows, strict=True)]


def serve(
    engine: Engine, prompts: list, joins: tuple, new: list, ahead: bool = False
) -> tuple[list, list, list]:
    """Each prompt submitted at its iteration of the loop; (tokens, logit rows) of each
    request and the decode steps' sizes."""
    engine.prompt_cache.clear()  # every run prefills its prompts whole
    sched = Recording(engine, ahead)
    requests, it = [None] * len(prompts), 0
    while not all(r is not None and r.done.is_set() for r in requests):
        for i, at in enumerate(joins):
            if at == it:
                params = GenerationParams(max_new_tokens=new[i], greedy=True)
                requests[i] = sched.submit(prompts[i], params, ignore_eos=True)
        sched.run_once()
        it += 1
        assert it < 20_000, "the scheduler did not finish"
    assert all(r.finish_reason == "length" for r in requests)
    tokens = [list(r.generated) for r in requests]
    return tokens, [sched.logits.get(r.id, []) for r in requests], sched.sizes


def differing(a: list, b: list) -> int:
    """Logit rows of `a` not bit-identical to `b`'s (the lists of each request)."""
    pairs = [pair for ra, rb in zip(a, b, strict=True) for pair in zip(ra, rb, strict=True)]
    return sum(not np.array_equal(x, y) for x, y in pairs)


def check_against_solo(engine: Engine, prompts: list, joins: tuple, new: list) -> list:
    together, logits, sizes = serve(engine, prompts, joins, new)
    ahead, _, _ = serve(engine, prompts, joins, new, ahead=True)
    assert ahead == together, "steps launched ahead gave other tokens than steps waited for"
    solo = [serve(engine, [p], (0,), [n]) for p, n in zip(prompts, new, strict=True)]
    for i, (tokens, rows, _) in enumerate(solo):
        assert together[i] == tokens[0], f"request {i}: tokens differ from its solo run"
        assert len(logits[i]) == len(rows[0]) == new[i]
        bad = differing([logits[i]], rows)
        assert bad == 0, f"request {i}: {bad} of {new[i]} logit rows differ from its solo run"
    return sizes


@pytest.fixture(scope="module")
def invariant_dirs(tmp_path_factory):
    """Tiny random checkpoints: MLX 4-bit whose input projections are stored as groups (16
    value heads keep each part 8-row aligned: one launch at one row, part by part past
    it), and bf16 (the SIMT kernel, norms apart)."""
    from engine.testing.synth import SHAPES, write_checkpoint
    from engine.testing.tiny import write_tokenizer

    shape = dict(SHAPES["tiny"], linear_num_key_heads=4, linear_num_value_heads=16)
    root = tmp_path_factory.mktemp("invariant")
    dirs = {fmt: write_checkpoint(root / fmt, shape, fmt, seed=11) for fmt in ("mlx4", "bf16")}
    for path in dirs.values():
        write_tokenizer(path)
    return dirs


@pytest.fixture(scope="module", params=["mlx4", "bf16"])
def engine(request, invariant_dirs):
    e = Engine.load(invariant_dirs[request.param], bf16(True), context=1024, streams=8, max_rows=64)
    if request.param == "mlx4":
        assert e.model.w["layers.0.linear_attn.in_proj_qkv"].fused is not None
    yield e
    e.unload()


@pytest.mark.parametrize("streams", range(1, 9))
def test_concurrent_equals_solo_bit_for_bit(engine, streams):
    prompts = [prompt(n, seed=i) for i, n in enumerate(LENGTHS[:streams])]
    new = [36 + 2 * (i % 3) for i in range(streams)]  # they leave at different steps too
    sizes = check_against_solo(engine, prompts, JOINS[:streams], new)
    assert max(sizes) == streams  # every request decoded beside all the others at some step
    if streams > 1:
        assert len(set(sizes)) > 1  # and at other batch sizes too
    print(f"\n[batch-invariant, {engine.model_dir.name}] {streams} streams: steps of {set(sizes)}")


def test_without_the_mode_the_batch_shows(invariant_dirs):
    """The same requests without the mode: rows decoded beside others are summed otherwise
    (the stored groups part by part behind a separate norm, other variants, other warps in
    the attention), which the bitwise comparison sees."""
    e = Engine.load(invariant_dirs["mlx4"], bf16(False), context=1024, streams=3, max_rows=64)
    prompts = [prompt(n, seed=i) for i, n in enumerate(LENGTHS[:3])]
    new = [36, 38, 40]
    _, logits, sizes = serve(e, prompts, JOINS[:3], new)
    solo = [serve(e, [p], (0,), [n])[1][0] for p, n in zip(prompts, new, strict=True)]
    bad = differing(logits, solo)
    print(f"\n[default bf16] {bad} of {sum(new)} logit rows differ from solo (steps {set(sizes)})")
    e.unload()
    assert bad > 0


def step_ms(engine: Engine, B: int, position: int, steps: int = 64, rounds: int = 3) -> float:
    """Milliseconds a graph-replayed decode step of B rows takes from `position` (slots 0..
    B-1, reset afterwards): the best of `rounds` runs of `steps` chained steps."""
    import cupy

    be, best = engine.backend, float("inf")
    for _ in range(rounds):
        be.graphs.replay(Batch.step([(s, position) for s in range(B)]), np.zeros(B, np.int32))
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(be.stream)
        for _ in range(steps):
            be.graphs.replay_next(B)
        e1.record(be.stream)
        e1.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(e0, e1) / steps)
    for s in range(B):
        be.reset_slot(s)
    return best


def test_the_4b_served_with_4_streams(tmp_path_factory):
    """A random checkpoint at the Qwen3.5-4B shape (MLX 4-bit) under `snug serve`'s settings
    with 4 streams (the mode on by default there): 4 requests joining at different steps get
    what each gets alone, bit for bit. Then the cost: the decode step with the mode off and
    on, at one and four streams, for short rows (the graph of 32 splits) and long ones."""
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("inv4b") / "4B", "4B", "mlx4", seed=4)
    write_tokenizer(path)
    args = argparse.Namespace(batch_invariant=None, streams=4)
    served = with_batch_invariant(EngineSettings(backend="cuda"), args)
    assert served.batch_invariant and served.compute_dtype == "bfloat16"
    timings = {}
    for on in (False, True):
        settings = dataclasses.replace(served, batch_invariant=on)
        engine = Engine.load(path, settings, context=4096, streams=4, max_rows=256)
        timings[on] = {(B, pos): step_ms(engine, B, pos) for B in (1, 4) for pos in (100, 2000)}
        if on:
            prompts = [prompt(n, seed=20 + i) for i, n in enumerate((5, 300, 40, 90))]
            sizes = check_against_solo(engine, prompts, (0, 2, 5, 9), [24, 26, 28, 30])
            assert max(sizes) == 4
        engine.unload()
    for (B, pos), off in timings[False].items():
        on = timings[True][(B, pos)]
        print(
            f"\n[4B decode, {B} stream(s) at {pos} tokens] batch-invariant off {off:.3f} ms "
            f"({B * 1e3 / off:.0f} tok/s), on {on:.3f} ms ({B * 1e3 / on:.0f} tok/s): "
            f"{100 * (on / off - 1):+.1f}%"
        )
