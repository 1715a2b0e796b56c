"""The same requests served again give the same bits, in both half precisions: a decode
step's sums are added in a fixed order (docs/architecture.md, "Greedy tokens do not depend
on the path"), including where gemv4 runs the residual add and norm for several rows at once.
The checkpoint is the tiny shape with a 1,024-wide residual stream, so that each row's norm
spans several warps of gemv4's add + norm prologue (at 256 one warp takes a whole row)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.cuda.projections import Prologue
from engine.config import EngineSettings
from engine.session import Engine
from tests.device.test_batch_invariant_cuda import differing, prompt, serve


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    from engine.testing.synth import SHAPES, write_checkpoint
    from engine.testing.tiny import write_tokenizer

    shape = dict(SHAPES["tiny"], hidden_size=1024)
    path = write_checkpoint(tmp_path_factory.mktemp("repeatable") / "mlx4", shape, "mlx4", seed=13)
    write_tokenizer(path)
    return path


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_three_streams_twice_the_same_bits(wide_dir, dtype):
    settings = EngineSettings(backend="cuda", compute_dtype=dtype, batch_invariant=False)
    engine = Engine.load(wide_dir, settings, context=1024, streams=3, max_rows=64)
    try:
        prompts = [prompt(n, seed=30 + i) for i, n in enumerate((9, 70, 33))]
        joins, new = (0, 2, 4), [40, 44, 48]
        first_tokens, first, sizes = serve(engine, prompts, joins, new)
        assert 3 in sizes  # steps of three rows ran
        # gemv4 ran the add + norm prologue at several rows
        tuner = engine.backend.projections.tuner
        multi = [k for k, c in tuner.choice.items() if k[1] > 1 and k[5] == Prologue.ADD_NORM]
        assert any(tuner.choice[k][0] == "mma" for k in multi), sorted(tuner.choice)
        for _ in range(2):
            tokens, again, _ = serve(engine, prompts, joins, new)
            bad = differing(again, first)
            assert bad == 0, f"{dtype}: {bad} of {sum(new)} logit rows differ from the first run"
            assert tokens == first_tokens
    finally:
        engine.unload()
    print(f"\n[repeatable, {dtype}] {sum(new)} logit rows, steps of {sorted(set(sizes))}")
    assert np.isfinite(np.concatenate([np.stack(r) for r in first])).all()
