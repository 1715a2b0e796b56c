"""What the 8-bit KV cache costs in quality, measured on the host with the numpy backend.

The numpy backend computes in fp32, so its default cache is the exact reference. Against
it, on the same prompt and the same fed tokens, this runs two caches:

    bf16   keys and values rounded to bf16 as they are written (what the default cache
           holds on a GPU in bf16), so the 8-bit cache's error can be read next to it
    int8   the 8-bit cache (engine/backends/kv_int8.py), as the engine runs it

and reports per cache: the largest logit error over the prompt's rows and over the decode
steps (fed the reference's greedy tokens, relative to the largest reference logit), the
share of those rows whose argmax agrees with the reference's, and how many free-running
greedy tokens equal the reference's before the first that differs.

    python -m engine.testing.kv_quality            # the table in docs/kernels.md

The tiny presets (engine.testing.tiny) need torch and transformers to be built; the "tiny"
shape of engine.testing.synth (head dim 256, as the real models) needs nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends.base import Batch
from engine.backends.numpy_backend import NumpyBackend
from engine.bf16 import from_bf16, to_bf16
from engine.config import EngineSettings

CACHES = ("bf16", "int8")


class Bf16CacheNumpy(NumpyBackend):
    """The numpy backend with its cache rounded to bf16 as rows are written."""

    def _write_kv(self, layer: int, slot: int, start: int, k: Any, v: Any) -> None:
        super()._write_kv(layer, slot, start, from_bf16(to_bf16(k)), from_bf16(to_bf16(v)))


@dataclass(frozen=True)
class Quality:
    """One cache against the fp32 cache on one model and prompt."""

    model: str
    cache: str
    prompt: int
    steps: int
    prefill_rel: float  # max |logit - ref| / max |ref| over every prompt row
    decode_rel: float  # the same over the decode steps, fed the reference's tokens
    top1: float  # share of prompt rows and steps whose argmax is the reference's
    greedy_same: int  # free-running greedy tokens equal to the reference's, from the first

    def row(self) -> str:
        return (
            f"| {self.model} | {self.cache} | {self.prompt} + {self.steps} | "
            f"{self.prefill_rel:.1e} | {self.decode_rel:.1e} | {100 * self.top1:.1f}% | "
            f"{self.greedy_same} / {self.steps} |"
        )


HEADER = (
    "| model | cache | tokens (prompt + steps) | prefill logit error | decode logit error "
    "| argmax agreement | greedy tokens equal |\n| --- | --- | --- | --- | --- | --- | --- |"
)


def _model(model_dir: Path, cache: str, context: int) -> Any:
    from engine.checkpoint.checkpoint import Checkpoint
    from engine.models.qwen35 import Qwen35Model

    kind = Bf16CacheNumpy if cache == "bf16" else NumpyBackend
    backend = kind(EngineSettings(backend="numpy", kv_cache="int8" if cache == "int8" else "bf16"))
    ck = Checkpoint.open(model_dir)
    weights = backend.load_weights(ck, ck.config)
    backend.alloc_state(ck.config, 1, context)
    return Qwen35Model(ck.config, backend, weights)


def run(
    model: Any, prompt: list[int], steps: int, forced: list[int] | None = None, window: int = 64
) -> tuple[np.ndarray, list[int], np.ndarray]:
    """Prefill in windows of `window` rows (every row's logits), then `steps` greedy decode
    steps; `forced` feeds those tokens instead of the model's own picks. Returns (prefill
    logits [T, V], each step's greedy pick, step logits [steps, V])."""
    be = model.backend
    be.reset_slot(0)
    rows = []
    for s in range(0, len(prompt), window):
        ids = np.array(prompt[s : s + window])
        logits = model.forward(Batch.window(0, s, len(ids)), ids, all_logits=True)
        rows.append(be.to_host(logits))
    prefill = np.concatenate(rows)
    last, greedy, step_logits = prefill[-1], [], []
    for i in range(steps):
        greedy.append(int(last.argmax()))
        feed = greedy[-1] if forced is None else forced[i]
        batch = Batch.step([(0, len(prompt) + i)])
        last = be.to_host(model.forward(batch, np.array([feed])))[0]
        step_logits.append(last)
    return prefill, greedy, np.stack(step_logits)


def measure(model_dir: Path, name: str, prompt: list[int], steps: int) -> list[Quality]:
    """Each cache of CACHES against the fp32 cache on `prompt` and `steps` decode steps."""
    context = len(prompt) + steps
    ref_prefill, ref_greedy, ref_steps = run(_model(model_dir, "fp32", context), prompt, steps)
    ref_rows = np.concatenate([ref_prefill, ref_steps])
    scale = float(np.abs(ref_rows).max())
    out = []
    for cache in CACHES:
        model = _model(model_dir, cache, context)
        prefill, _, step_logits = run(model, prompt, steps, forced=ref_greedy)
        rows = np.concatenate([prefill, step_logits])
        _, free, _ = run(model, prompt, steps)
        pairs = enumerate(zip(free, ref_greedy, strict=True))
        same = next((i for i, (a, b) in pairs if a != b), steps)
        out.append(
            Quality(
                model=name,
                cache=cache,
                prompt=len(prompt),
                steps=steps,
                prefill_rel=float(np.abs(prefill - ref_prefill).max()) / scale,
                decode_rel=float(np.abs(step_logits - ref_steps).max()) / scale,
                top1=float(np.mean(rows.argmax(1) == ref_rows.argmax(1))),
                greedy_same=same,
            )
        )
    return out


def prompt_ids(length: int, vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed + length).integers(0, vocab, size=length).tolist()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens (default 256)")
    p.add_argument("--steps", type=int, default=64, help="decode steps (default 64)")
    p.add_argument("--no-presets", action="store_true", help="only the synth tiny shape")
    args = p.parse_args(argv)
    from engine.testing.synth import write_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        models: list[tuple[str, Path]] = []
        if not args.no_presets:
            from engine.testing.tiny import TINY_PRESETS, build_checkpoint

            for preset in TINY_PRESETS:
                models.append((preset, build_checkpoint(preset, "hf-fp32", Path(tmp) / preset)))
        for fmt in ("mlx4", "bf16"):
            path = write_checkpoint(Path(tmp) / f"synth-{fmt}", "tiny", fmt, seed=3)
            models.append((f"synth tiny hd256 ({fmt})", path))
        print(HEADER)
        for name, path in models:
            for q in measure(path, name, prompt_ids(args.prompt, 400), args.steps):
                print(q.row(), flush=True)


if __name__ == "__main__":
    main()
