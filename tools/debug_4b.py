import numpy as np
from engine.backends.base import Batch
from engine.backends.cuda.backend import CudaBackend
from engine.backends.cuda.synth import write_checkpoint
from engine.checkpoint.checkpoint import Checkpoint
from engine.models.qwen35 import Qwen35Model
import pathlib, sys

shape = sys.argv[1] if len(sys.argv) > 1 else "4B"
path = write_checkpoint(pathlib.Path(f"/tmp/dbg/{shape}"), shape, "bf16", seed=4)
ids = np.random.default_rng(4).integers(0, 1000, 64)
ck = Checkpoint.open(path)
be = CudaBackend(dtype="float32")
model = Qwen35Model(ck.config, be, be.load_weights(ck, ck.config))
be.alloc_state(ck.config, 2, 256)
rec = []
depth = [0]
def wrap(name):
    f = getattr(be, name)
    def g(*a, **k):
        depth[0] += 1
        try:
            out = f(*a, **k)
        finally:
            depth[0] -= 1
        if depth[0]:
            return out
        first = out[0] if isinstance(out, tuple) else out
        if isinstance(first, list):
            for i, o in enumerate(first):
                rec.append((f"{name}[{i}]", be.to_host(o)[-1].copy()))
        else:
            rec.append((name, be.to_host(first)[-1].copy()))
        return out
    setattr(be, name, g)
for n in ("norm_linear_many", "gated_delta_out", "attention", "norm_mlp"):
    wrap(n)
if len(sys.argv) > 2:  # tune every step kernel first, on slot 1
    model.forward(Batch.step([(1, 0)]), np.array([3]))
    be.reset_slot(1)
    print("pre-tuned", len(be.ops.gemv_choice))
model.forward(Batch.window(0, 0, 64), ids)
rec.clear()
model.forward(Batch.step([(0, 64)]), np.array([7]))
step = list(rec)
rec.clear()
model.forward(Batch.window(1, 0, 65), np.array(ids.tolist() + [7]))
win = list(rec)
print(len(step), len(win))
for (n1, a), (n2, b) in zip(step, win):
    d = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-9))
    if d > 1e-4:
        print("DIVERGE", n1, n2, d, a.shape)
        break
else:
    print("no divergence")
for i, (n1, a) in enumerate(step[:12]):
    print(i, n1, win[i][0], float(np.abs(a - win[i][1]).max() / max(np.abs(win[i][1]).max(), 1e-9)))
