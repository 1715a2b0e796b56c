"""The one module of the app that touches `engine.session`.

Everything the worker thread needs from the engine goes through here, so a change in the
engine's API is a change in this file only. Nothing here is called on the GUI thread except
`make_params`, which only builds a value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from engine.config import EngineSettings

Progress = Callable[[str, float], None]


class EngineLike(Protocol):
    """What the worker uses of `engine.session.Engine` (the test fake implements the same)."""

    backend_name: str
    decision: Any

    def held_bytes(self) -> int: ...
    def chat_ids(
        self, messages: list[dict[str, str]], enable_thinking: bool | None = None
    ) -> list[int]: ...
    def generate(self, prompt_ids: list[int], params: Any, cancel: Any = None) -> Iterator[Any]: ...
    def unload(self) -> None: ...


Loader = Callable[[str, EngineSettings, int, int, int, Progress | None], EngineLike]


def load_engine(
    model_dir: str,
    settings: EngineSettings,
    context: int,
    streams: int,
    max_rows: int,
    progress: Progress | None = None,
) -> EngineLike:
    """Load a model with the real engine. Slow: call it on the engine worker thread only."""
    from engine.session import Engine

    return Engine.load(
        model_dir,
        settings,
        context=context,
        streams=streams,
        max_rows=max_rows,
        progress=progress,
    )


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
