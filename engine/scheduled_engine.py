"""The app's engine over a `Scheduler`: its chat and a local server share the slots."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from engine.scheduler import Scheduler
from engine.session import Engine, GenerationParams, TokenEvent


class ScheduledEngine:
    """An `Engine` whose generation goes through a `Scheduler` (the app's engine worker can
    use it in place of the Engine: same `chat_ids` / `generate` / `held_bytes` / `unload`),
    so the app's chat and a local server share the slots."""

    def __init__(self, engine: Engine, queue_size: int = 16, prefill_chunk: int | None = None):
        self.engine = engine
        self.before_unload: Callable[[], None] | None = None  # called first by `unload`
        self.scheduler = Scheduler(engine, queue_size, prefill_chunk)
        self.scheduler.more_room = "load the model again with more streams (Load tab, Streams)"
        self.scheduler.start()
        self.backend_name = engine.backend_name
        self.decision = engine.decision
        # The chat reads replies with it: to go on with one (Continue), hold its thinking to
        # a budget, count what attached files cost.
        self.tokenizer = engine.tokenizer

    def held_bytes(self) -> int:
        return self.engine.held_bytes()

    def chat_ids(self, messages: list[dict], enable_thinking: bool | None = None) -> list[int]:
        return self.engine.chat_ids(messages, enable_thinking=enable_thinking)

    def generate(
        self,
        prompt_ids: list[int],
        params: GenerationParams | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[TokenEvent]:
        return self.scheduler.generate(prompt_ids, params, cancel)

    def unload(self) -> None:
        if self.before_unload is not None:  # a server over the scheduler ends its replies
            self.before_unload()
        self.scheduler.close()
        self.engine.unload()
