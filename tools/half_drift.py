"""How far transformers itself drifts in half precision on a random checkpoint (CPU is fine).

The device tests bound Snug's half-precision logits against the numpy backend (fp32). This
prints the same measure for the reference implementation, transformers in bf16 and fp16
against transformers in fp32 on the same weights and prompt, as the yardstick for those
bounds: relative error = max |logits - fp32 logits| / max |fp32 logits| over every prompt row.

    python3 tools/half_drift.py [--shape tiny] [--seed 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from engine.backends.cuda.synth import write_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp) / args.shape, args.shape, "bf16", seed=args.seed)
        ids = torch.tensor([[(i * 37 + 11) % 1000 for i in range(args.prompt)]])
        logits = {}
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
            with torch.no_grad():
                logits[dtype] = model(input_ids=ids).logits[0].float().numpy()
    ref = logits[torch.float32]
    for dtype in (torch.bfloat16, torch.float16):
        rel = float(np.abs(logits[dtype] - ref).max() / np.abs(ref).max())
        print(
            f"transformers {str(dtype).split('.')[-1]} vs float32 ({args.shape}, seed "
            f"{args.seed}, {args.prompt}-token prompt): relative logit error {rel:.2e}"
        )


if __name__ == "__main__":
    main()
