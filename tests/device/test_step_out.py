"""A decode step's DeltaNet through out_proj in one launch (gdn_step_out.cu) against the same
step with out_proj as its own gemv4 launch: the logits agree to bf16 rounding over several
steps of two streams at once (each block's columns 64 wide, and 32 wide); the sums come out
the same on every run, eager and in the captured decode graph; the tickets that find the
last cluster are left at zero."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.backends.cuda.deltanet_out import StepOut
from engine.backends.cuda.tuning import Tuning
from tests.device.test_forward import PROMPT, _model
from tests.device.test_fused import _captured_run
from tests.device.test_kernels import TOL, _rel

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def step_dirs(tmp_path_factory):
    from engine.testing.synth import SHAPES, write_checkpoint

    root = tmp_path_factory.mktemp("step_out")
    tiny = SHAPES["tiny"]  # 2 key heads, 4 value heads: 64 columns a block of 4
    narrow = dict(tiny, linear_num_value_heads=2)  # one value head a key head: 32 columns
    return {
        64: write_checkpoint(root / "cb64", tiny, "mlx4", seed=5),
        32: write_checkpoint(root / "cb32", narrow, "mlx4", seed=6),
    }


def _backend(fused: bool):
    from engine.backends.cuda.backend import CudaBackend
    from engine.config import EngineSettings

    return CudaBackend(EngineSettings(), dtype="bfloat16", tuning=Tuning(fused_out_proj=fused))


def _counted(monkeypatch) -> list[int]:
    """Counts StepOut.run's launches."""
    calls = [0]
    run = StepOut.run

    def counting(self, *args, **kw):
        calls[0] += 1
        return run(self, *args, **kw)

    monkeypatch.setattr(StepOut, "run", counting)
    return calls


def _two_streams(model, steps: int) -> list[np.ndarray]:
    """Two prompts in slots 0 and 1, then `steps` steps of both streams in one batch, fed
    fixed tokens (so both backends see the same inputs); the logits of each forward."""
    be = model.backend
    second = [(t * 7 + 3) % 1000 for t in PROMPT[:13]]
    out = []
    for slot, prompt in ((0, PROMPT), (1, second)):
        out.append(be.to_host(model.forward(Batch.window(slot, 0, len(prompt)), np.array(prompt))))
    for i in range(steps):
        batch = Batch.step([(0, len(PROMPT) + i), (1, len(second) + i)])
        feed = np.array([(i * 31 + 5) % 1000, (i * 17 + 9) % 1000])
        out.append(be.to_host(model.forward(batch, feed)))
    return out


@pytest.mark.parametrize("cb", [64, 32])
def test_fused_step_matches_out_projs_own_launch(step_dirs, monkeypatch, cb):
    from engine.backends.cuda.launch import compute_capability

    if compute_capability() < 90:
        pytest.skip("the fused step runs over a thread block cluster (compute capability 9.0)")
    calls = _counted(monkeypatch)
    model = _model(step_dirs[cb], _backend(True))
    fused = _two_streams(model, 6)
    launched = calls[0]
    plain = _two_streams(_model(step_dirs[cb], _backend(False)), 6)
    # every DeltaNet layer of every step, and none without the fused step
    assert launched == 6 * len(model.config.linear_layers) and calls[0] == launched
    for i, (a, b) in enumerate(zip(fused, plain, strict=True)):
        assert _rel(a, b) < TOL["bfloat16"], i


def test_fused_step_is_the_same_every_run_and_in_the_graph(step_dirs, monkeypatch):
    from engine.backends.cuda.launch import compute_capability

    if compute_capability() < 90:
        pytest.skip("the fused step runs over a thread block cluster (compute capability 9.0)")
    calls = _counted(monkeypatch)
    runs = []
    for _ in range(2):
        be = _backend(True)
        runs.append(_captured_run(be, step_dirs[64]))
        assert int(be.to_host(be.step_out.tickets).max()) == 0
    assert calls[0] > 0
    for a, b in zip(*runs, strict=True):
        assert np.array_equal(a, b)
