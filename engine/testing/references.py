"""Reference runners: the same prompt through transformers (fp32) and mlx-lm.

Both return {'prefill': float32 [T, V] logits of every prompt row, 'greedy': greedy tokens
decoded with the cache (greedy[0] = argmax of the last prefill row), 'step_logits': float32
[steps, V], row i = logits after feeding greedy[i]}. torch, transformers and mlx are imported
inside the functions, so importing this module stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def hf_logits(model_dir: str | Path, ids: list[int], decode_steps: int = 0) -> dict[str, Any]:
    """Run transformers in fp32 with a cache: prefill `ids`, then greedy-decode.

    Returns {'prefill': float32 [T, V] logits of every prompt row, 'greedy': the
    `decode_steps` greedy tokens (greedy[0] = argmax of the last prefill row), 'step_logits':
    float32 [decode_steps, V], row i = logits after feeding greedy[i] one token at a time}.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([list(ids)]), use_cache=True)
        prefill = out.logits[0].float().numpy()
        cache, last = out.cache, out.logits[0, -1]
        greedy: list[int] = []
        steps: list[np.ndarray] = []
        for _ in range(decode_steps):
            greedy.append(int(torch.argmax(last)))
            out = model(input_ids=torch.tensor([[greedy[-1]]]), cache=cache, use_cache=True)
            cache, last = out.cache, out.logits[0, -1]
            steps.append(last.float().numpy())
    return _result(prefill, greedy, steps)


def mlx_logits(
    model_dir: str | Path, ids: list[int], decode_steps: int = 0, compute_dtype: str | None = None
) -> dict[str, Any]:
    """Run mlx-lm on a checkpoint with its prompt cache; same result layout as `hf_logits`.

    compute_dtype "float32" casts every floating parameter (incl. scales and biases) to fp32
    first, which removes mlx's bf16 activation rounding; None runs the file's dtype as mlx-lm
    does by default.
    """
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(str(model_dir))
    if compute_dtype is not None:
        target = getattr(mx, compute_dtype)

        def cast(a: Any) -> Any:
            return a.astype(target) if mx.issubdtype(a.dtype, mx.floating) else a

        model.update(tree_map(cast, model.parameters()))
    cache = make_prompt_cache(model)
    logits = model(mx.array([list(ids)]), cache=cache)[0]  # [T, V]
    prefill = np.array(logits.astype(mx.float32))
    last = logits[-1]
    greedy: list[int] = []
    steps: list[np.ndarray] = []
    for _ in range(decode_steps):
        greedy.append(int(mx.argmax(last).item()))
        last = model(mx.array([[greedy[-1]]]), cache=cache)[0, -1]
        steps.append(np.array(last.astype(mx.float32)))
    return _result(prefill, greedy, steps)


def _result(prefill: np.ndarray, greedy: list[int], steps: list[np.ndarray]) -> dict[str, Any]:
    V = prefill.shape[-1]
    step_logits = np.stack(steps) if steps else np.zeros((0, V), np.float32)
    return {
        "prefill": prefill.astype(np.float32),
        "greedy": greedy,
        "step_logits": step_logits.astype(np.float32),
    }
