"""Demo mode (`snug --demo`, tools/screenshots.py): a replayed engine and a simulated card.

Nothing here runs a model: DemoEngine replays a written reply token by token, and
DemoGpu reports an 8 GiB laptop card. Planning still uses the real engine.memory.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from pathlib import Path

from PySide6.QtCore import QSettings

from app.context import AppContext, build_context
from app.engine_bridge import Loader, LoadRequest, Progress
from engine.memory.speed import REFERENCE_CARDS
from engine.request_types import GenerationStats, TokenEvent

GIB = 1 << 30
REPLY = """<think>
The user wants to know why a 4-bit model fits a small card. Compare the weight bytes and
mention the stream state and the scratch.
</think>

A **4-bit** build stores each weight in half a byte plus a small scale and bias per group
of 64, so Qwen3.5-4B needs about **2.4 GB** instead of 8.4 GB in bf16.

What else lives on the card:

| part | grows with |
| --- | --- |
| stream state | context length × streams |
| scratch | rows per forward pass |
| workspace | prompt length (lazily) |

```python
decision = decide(specs, config, settings, card, context=8192, streams=1)
print(decision.verdict)  # fits
```

Keep the **reserve** for your desktop, and the model loads without surprises.
"""
# The reply to a message that asks to solve something (the screenshots' formulas).
MATH_REPLY = r"""<think>
A quadratic: factor it, then check the roots with the formula.
</think>

The equation $x^2 - 3x + 2 = 0$ factors as $(x - 1)(x - 2) = 0$, so its roots are
$x_1 = 1$ and $x_2 = 2$. The quadratic formula gives the same:

$$
x = \frac{-b \pm \sqrt{b^2 - 4ac}}{2a} = \frac{3 \pm \sqrt{9 - 8}}{2} = \frac{3 \pm 1}{2}
$$

As a check, the companion matrix

\[ C = \begin{pmatrix} 0 & -2 \\ 1 & 3 \end{pmatrix} \]

has the eigenvalues $\lambda \in \{1, 2\}$, and $x_1 + x_2 = -\frac{b}{a} = 3$. So the
answer is $\boxed{x \in \{1, 2\}}$.
"""


class DemoEngine:
    """Replays REPLY (MATH_REPLY to a message that asks to solve something); `delay` is
    seconds per token."""

    backend_name = "cuda"
    decision = None

    def __init__(self, delay: float = 0.02, held: int = int(2.9 * GIB)) -> None:
        self.delay = delay
        self._held = held
        self._reply = REPLY

    def held_bytes(self) -> int:
        return self._held

    def chat_ids(self, messages, enable_thinking=None) -> list[int]:
        last = str(messages[-1]["content"]) if messages else ""
        self._reply = MATH_REPLY if last.lower().startswith("solve") else REPLY
        return list(range(sum(len(m["content"]) for m in messages) // 4 + 8))

    def generate(self, prompt_ids, params, cancel: threading.Event | None = None):
        pieces = re.findall(r"\s*\S+|\s+", self._reply)
        start = time.monotonic()
        time.sleep(0.12)  # prefill
        ttft = time.monotonic() - start
        for i, piece in enumerate(pieces):
            if cancel is not None and cancel.is_set():
                break
            time.sleep(self.delay)
            yield TokenEvent(i, piece)
        n = len(pieces)
        reason = "cancelled" if cancel is not None and cancel.is_set() else "stop"
        elapsed = max(time.monotonic() - start - ttft, 1e-3)
        stats = GenerationStats(len(prompt_ids), n, ttft, len(prompt_ids) / ttft, n / elapsed)
        yield TokenEvent(n, "", True, reason, stats)

    def unload(self) -> None:
        self._held = 0


# The demo card's speed for the plan's prediction: an RTX 4060's (engine/memory/speed.py).
DEMO_SPEED = REFERENCE_CARDS["RTX 4060 8GB"]


class DemoGpu:
    """An 8 GiB laptop card with a desktop using 0.7 GiB; Snug's share follows the engine."""

    ours = 0

    def open(self) -> None:
        self._t0 = time.monotonic()

    def read(self) -> dict:
        total = 8 * GIB
        wobble = int(0.05 * GIB * ((time.monotonic() - self._t0) % 3))
        used = int(0.7 * GIB) + wobble + DemoGpu.ours
        return {
            "name": "NVIDIA GeForce RTX 4060 Laptop GPU",
            "total": total,
            "used": used,
            "free": total - used,
            "ours": DemoGpu.ours,
            "speed": DEMO_SPEED,
            "capability": 89,  # an RTX 4060 (sm_89): prefill attention runs fused
        }

    def close(self) -> None:
        pass


def demo_loader(delay: float = 0.02) -> Loader:
    def load(request: LoadRequest, progress: Progress | None = None) -> DemoEngine:
        for stage, f in (("reading checkpoint", 0.0), ("loading weights", 0.5), ("ready", 1.0)):
            if progress is not None:
                progress(stage, f)
            time.sleep(0.05)
        engine = DemoEngine(delay)
        DemoGpu.ours = engine.held_bytes()
        return engine

    return load


def demo_context(
    folder: Path | None = None, delay: float = 0.02, loader=None, cache_dir: str | None = None
) -> AppContext:
    """A context with its settings and chats in a throwaway folder (or `folder`); its library
    reads the Hugging Face cache at `cache_dir` (None: the user's)."""
    base = Path(folder or tempfile.mkdtemp(prefix="snug-demo-"))
    store = QSettings(str(base / "snug.ini"), QSettings.Format.IniFormat)
    return build_context(
        store=store,
        chats_dir=base / "chats",
        loader=loader or demo_loader(delay),
        gpu_source=DemoGpu,
        cache_dir=cache_dir,
    )
