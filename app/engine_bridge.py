"""The one module of the app that touches `engine.session`.

Everything the worker thread needs from the engine goes through here, so a change in the
engine's API is a change in this file only. Nothing here is called on the GUI thread except
`make_params` and `LoadRequest`, which only build values.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.config import EngineSettings

Progress = Callable[[str, float], None]


class EngineLike(Protocol):
    """What the worker uses of `engine.session.Engine` (the test fake implements the same)."""

    backend_name: str
    decision: Any
    tokenizer: Any  # `encode(text)`: a reply gone on with (ReplyRequest.partial)

    def held_bytes(self) -> int: ...
    def chat_ids(
        self, messages: list[dict[str, str]], enable_thinking: bool | None = None
    ) -> list[int]: ...
    def generate(self, prompt_ids: list[int], params: Any, cancel: Any = None) -> Iterator[Any]: ...
    def unload(self) -> None: ...


@dataclass(frozen=True)
class ReplyRequest:
    """What the GUI asks the engine thread to answer.

    `left_out`: the messages the chat's last prompt left out to fit the context, which this
    one keeps leaving out while it fits (engine/context_fit.py). `partial`: a reply to go
    on with (Continue): the prompt is the one it was answering, then its text so far.
    `thinking_budget`: the most tokens the reply may think before it answers (0: no limit;
    engine/thinking_budget.py)."""

    messages: list[dict[str, str]]
    params: Any
    thinking: bool | None
    cancel: Any  # threading.Event: set, the reply ends at its next token
    left_out: int = 0
    partial: str = ""
    thinking_budget: int = 0


@dataclass(frozen=True)
class LoadRequest:
    """What the GUI asks the engine thread to load, and under which rules.

    `settings` are the engine's (environment first, then the user's settings), the prompt
    cache's folder (in the app's data folder) and tier budgets among them. With
    `refuse_cpu` the worker refuses a load that would run on the numpy backend, before
    loading when `gpu_present` is False (whether NVML has found a card; None: not asked).
    """

    model_dir: str
    settings: EngineSettings
    context: int
    streams: int = 1
    max_rows: int | None = None  # None (or 0, the settings' "Auto"): the plan's choice
    refuse_cpu: bool = False
    gpu_present: bool | None = None
    # Set to stop the load at its next stage (EngineController.cancel_load); what it
    # allocated is released, as for any failed load.
    cancel: threading.Event | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_rows == 0:
            object.__setattr__(self, "max_rows", None)
        sizes = {"context": self.context, "streams": self.streams, "max_rows": self.max_rows}
        for name, value in sizes.items():
            if value is not None and value < 1:
                raise ValueError(f"load request {name} = {value} must be at least 1")


Loader = Callable[[LoadRequest, Progress | None], EngineLike]


def load_engine(request: LoadRequest, progress: Progress | None = None) -> EngineLike:
    """Load a model with the real engine. Slow: call it on the engine worker thread only."""
    from engine.session import Engine

    return Engine.load(
        request.model_dir,
        request.settings,
        context=request.context,
        streams=request.streams,
        max_rows=request.max_rows,
        progress=progress,
    )


def is_local(engine: Any) -> bool:
    """Whether `engine` is the engine's own Engine (not a remote server's, nor a fake)."""
    from engine.session import Engine

    return isinstance(engine, Engine)


def make_params(sampling: dict[str, Any]) -> Any:
    """GenerationParams from the settings' sampling dict (unknown keys are dropped)."""
    from engine.session import GenerationParams

    fields = {
        k: sampling[k]
        for k in (
            "max_new_tokens",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "presence_penalty",
            "seed",
            "greedy",
        )
        if k in sampling
    }
    return GenerationParams(**fields)
