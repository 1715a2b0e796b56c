"""A stand-in for engine.session.Engine that replays recorded token streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from app.engine_bridge import LoadRequest
from engine.session import GenerationStats, TokenEvent

REPLY = [
    "Hello",
    "!",
    " Snug",
    " runs",
    " Qwen3.5",
    " on",
    " your",
    " GPU",
    ".",
    "\n\n",
    "- **fast**",
    "\n",
    "- *small*",
]
THINKING_REPLY = ["Let me", " think", ".", "</think>", "\n\n", "The answer", " is", " 42", "."]


class Chars:
    """The fake's tokenizer: an id for every 4 characters, as its chat_ids counts."""

    def encode(self, text: str) -> list[int]:
        return [7] * (len(text) // 4 + 1)


class FakeEngine:
    """Implements the slice of the Engine API the app uses; `delay` is seconds per token."""

    backend_name = "numpy"
    decision = None

    def __init__(
        self,
        script: list[str] | None = None,
        delay: float = 0.005,
        fail_with: Exception | None = None,
        backend: str = "numpy",
        context: int | None = None,
    ) -> None:
        self.script = list(script if script is not None else REPLY)
        self.delay = delay
        self.fail_with = fail_with
        self.backend_name = backend
        self.context = context  # tokens, where set: the worker fits long chats to it
        self.loaded = True
        self.calls: list[list[dict[str, str]]] = []
        self.prompts: list[list[int]] = []  # each generate's prompt ids
        self.params: list = []  # each generate's GenerationParams
        self.tokenizer = Chars()
        self.threads: set[str] = set()

    @classmethod
    def compiling_loader(cls, stages: list[int]):
        """A loader as slow as a first load compiling its kernels: 100 stages of 50 ms, each
        reported and appended to `stages` (a cancelled load stops at its next report)."""

        def load(request: LoadRequest, progress=None) -> FakeEngine:
            for i in range(100):
                progress(f"compiling kernels, {i} of 100", 0.9)
                stages.append(i)
                time.sleep(0.05)
            return cls()

        return load

    @classmethod
    def loader(cls, **kwargs):
        """A loader for EngineController that records what it was asked to load.

        `load.made` holds the engines it built, `load.requests` the LoadRequests it served.
        """
        made: list[FakeEngine] = []
        requests: list[LoadRequest] = []

        def load(request: LoadRequest, progress=None) -> FakeEngine:
            requests.append(request)
            if progress is not None:
                progress("weights", 0.5)
                progress("weights", 1.0)
            engine = cls(**kwargs)
            engine.threads.add(threading.get_ident())
            made.append(engine)
            return engine

        load.made = made
        load.requests = requests
        return load

    def held_bytes(self) -> int:
        return 512 << 20 if self.loaded else 0

    def chat_ids(self, messages, enable_thinking=None) -> list[int]:
        self.threads.add(threading.get_ident())
        self.calls.append(list(messages))
        return list(range(sum(len(m["content"]) for m in messages) // 4 + 1))

    def generate(self, prompt_ids, params, cancel=None) -> Iterator[TokenEvent]:
        self.threads.add(threading.get_ident())
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        start = time.monotonic()
        first = None
        n = 0
        most = getattr(params, "max_new_tokens", None) or len(self.script)
        for i, text in enumerate(self.script):
            if n == most:
                yield self._final(i, "length", prompt_ids, n, start, first)
                return
            time.sleep(self.delay)
            # After the token's time, as an engine sees a stop that came while it read the
            # prompt or worked out the token: the token is not given.
            if cancel is not None and cancel.is_set():
                yield self._final(i, "cancelled", prompt_ids, n, start, first)
                return
            if self.fail_with is not None and i == len(self.script) // 2:
                raise self.fail_with
            first = first if first is not None else time.monotonic() - start
            n += 1
            yield TokenEvent(token_id=i, text=text, finished=False)
        yield self._final(len(self.script), "stop", prompt_ids, n, start, first)

    @staticmethod
    def _final(i, reason, prompt_ids, n, start, first) -> TokenEvent:
        elapsed = max(time.monotonic() - start, 1e-6)
        stats = GenerationStats(len(prompt_ids), n, first or 0.0, 1000.0, n / elapsed)
        return TokenEvent(token_id=i, text="", finished=True, finish_reason=reason, stats=stats)

    def unload(self) -> None:
        self.loaded = False
