"""A random checkpoint at the Qwen3.5-4B shape: Snug's CUDA forward against transformers on
the same GPU (the harness is checked on the host with the tiny shape: 9.5e-6 against the
numpy backend)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Batch
from engine.checkpoint.checkpoint import Checkpoint
from engine.models.qwen35 import Qwen35Model

STEPS = 32
PROMPT = 64


@pytest.fixture(scope="module")
def shape_4b(tmp_path_factory):
    from engine.testing.synth import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("hf4b") / "4B", "4B", "bf16", seed=4)


@pytest.fixture(scope="module")
def reference(shape_4b):
    """transformers in fp32 on the GPU: prompt logits, then greedy decode with its cache."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(shape_4b), dtype=torch.float32)
    model = model.to("cuda").eval()
    ids = np.random.default_rng(4).integers(0, 200_000, PROMPT)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids.tolist()], device="cuda"), use_cache=True)
        prompt_logits = out.logits[0, -1].float().cpu().numpy()
        cache, last, greedy = out.past_key_values, out.logits[0, -1], []
        for _ in range(STEPS):
            greedy.append(int(torch.argmax(last)))
            out = model(
                input_ids=torch.tensor([[greedy[-1]]], device="cuda"),
                past_key_values=cache,
                use_cache=True,
            )
            cache, last = out.past_key_values, out.logits[0, -1]
    del model
    torch.cuda.empty_cache()
    return ids, prompt_logits, greedy


def snug(path, dtype, ids, forced):
    """Snug's CUDA forward: prompt logits, then one step per forced token; (logits, argmax)."""
    from engine.backends.cuda.backend import CudaBackend

    ck = Checkpoint.open(path)
    be = CudaBackend(dtype=dtype)
    model = Qwen35Model(ck.config, be, be.load_weights(ck, ck.config))
    be.alloc_state(ck.config, 1, 256)
    first = be.to_host(model.forward(Batch.window(0, 0, len(ids)), ids))[-1]
    picks = [int(first.argmax())]
    for i, token in enumerate(forced[:-1]):
        step = be.to_host(model.forward(Batch.step([(0, len(ids) + i)]), np.array([token])))
        picks.append(int(step[-1].argmax()))
    be.release()
    return first, picks


def test_fp32_greedy_tokens_equal_transformers(shape_4b, reference):
    ids, prompt_logits, greedy = reference
    first, picks = snug(shape_4b, "float32", ids, greedy)
    err = np.abs(first - prompt_logits).max() / np.abs(prompt_logits).max()
    print(f"\n[4B fp32 vs transformers] prompt logit rel error {err:.2e}")
    assert picks == greedy
    assert err <= 2e-2


def test_fp16_logits_within_bound_of_transformers(shape_4b, reference):
    ids, prompt_logits, greedy = reference
    first, _ = snug(shape_4b, "float16", ids, greedy[:1])
    err = np.abs(first - prompt_logits).max() / np.abs(prompt_logits).max()
    print(f"\n[4B fp16 vs transformers fp32] prompt logit rel error {err:.2e}")
    assert err <= 2e-2
