"""A model that runs elsewhere: any OpenAI-compatible server, through the `openai` client.

`RemoteEngine` has the shape the engine worker uses of a local Engine (app/engine_bridge.py's
EngineLike): `chat_ids` returns an opaque `RemotePrompt` (the messages; the server applies
the template), `generate` streams chat completions and yields events with `text`,
`finished`, `finish_reason` and `stats`. The server's thinking (`reasoning_content` or
`reasoning`) comes back wrapped in <think>...</think>, as a local model writes it, so the chat
shows it the same way. It holds no memory here: `held_bytes()` is 0 and `backend_name` is
"remote", so the gauge can say the model runs elsewhere.

`RemoteLoader` plugs it into the app's load path: a Loader that loads the targets it was
given (`request_for`) as RemoteEngines and passes every other request to the local loader.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import EngineSettings

if TYPE_CHECKING:
    from engine.request_types import GenerationStats

DEFAULT_URL = "http://127.0.0.1:8000/v1"


class RemoteError(Exception):
    """The server could not be reached or refused the request (its message is kept)."""


@dataclass(frozen=True)
class RemoteTarget:
    url: str = DEFAULT_URL
    api_key: str = ""
    model: str = ""
    context: int | None = None  # as /v1/models reports it, when it does

    @property
    def key(self) -> str:
        """How a LoadRequest names this target (never the API key)."""
        return f"{KEY_PREFIX}{self.model}@{self.url}"


KEY_PREFIX = "remote:"


def model_of_key(key: str) -> str | None:
    """The model a remote target's `key` names (not the server's address, which may carry
    credentials), or None where `key` names no remote target."""
    if not key.startswith(KEY_PREFIX):
        return None
    return key[len(KEY_PREFIX) :].partition("@")[0]


@dataclass(frozen=True)
class RemotePrompt:
    """What `chat_ids` returns for a remote model: the messages, for `generate`."""

    messages: tuple[dict[str, Any], ...]
    enable_thinking: bool | None


@dataclass(frozen=True)
class RemoteEvent:
    text: str
    finished: bool = False
    finish_reason: str | None = None
    stats: GenerationStats | None = None
    token_id: int = -1  # the server sends text, not ids


def _client(url: str, api_key: str, timeout: float) -> Any:
    try:
        from openai import OpenAI
    except ImportError as exc:
        raise RemoteError(
            "talking to a server needs the `openai` package: pip install openai"
        ) from exc
    return OpenAI(base_url=url, api_key=api_key or "none", max_retries=0, timeout=timeout)


def _explain(exc: Exception, url: str) -> RemoteError:
    import openai

    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        message = body.get("message") or str(exc)
        return RemoteError(f"the server at {url} answered {exc.status_code}: {message}")
    if isinstance(exc, openai.APIConnectionError):
        return RemoteError(f"cannot reach {url} ({exc}); is the server running?")
    return RemoteError(f"{type(exc).__name__}: {exc}")


def list_models(url: str, api_key: str = "", timeout: float = 10.0) -> list[dict[str, Any]]:
    """The server's models: [{"id", "context"}] (context None when the server does not say)."""
    client = _client(url, api_key, timeout)
    try:
        models = client.models.list().data
    except Exception as exc:
        raise _explain(exc, url) from exc
    finally:
        client.close()
    return [{"id": m.id, "context": (m.model_extra or {}).get("max_model_len")} for m in models]


class RemoteEngine:
    """Streams chat completions from `target`'s server; see the module docstring."""

    backend_name = "remote"
    decision = None

    def __init__(self, target: RemoteTarget, timeout: float = 600.0) -> None:
        self.target = target
        self.client = _client(target.url, target.api_key, timeout)
        self.model = target.model or self._first_model()

    def _first_model(self) -> str:
        models = list_models(self.target.url, self.target.api_key)
        if not models:
            raise RemoteError(f"the server at {self.target.url} lists no models")
        return models[0]["id"]

    def held_bytes(self) -> int:
        return 0

    def chat_ids(
        self, messages: list[dict[str, Any]], enable_thinking: bool | None = None
    ) -> RemotePrompt:
        return RemotePrompt(tuple(dict(m) for m in messages), enable_thinking)

    def generate(
        self, prompt: RemotePrompt, params: Any = None, cancel: threading.Event | None = None
    ) -> Iterator[RemoteEvent]:
        """Stream one reply. `params`: the app's GenerationParams (None: server defaults).
        Setting `cancel` closes the connection, which frees the server's slot."""
        t0 = time.perf_counter()
        try:
            stream = self.client.chat.completions.create(
                model=self.model,
                messages=list(prompt.messages),
                stream=True,
                stream_options={"include_usage": True},
                **_sampling(params, prompt.enable_thinking),
            )
        except Exception as exc:
            raise _explain(exc, self.target.url) from exc
        thinking, reason, usage, t_first, timings = False, None, None, None, {}
        try:
            for chunk in stream:
                if cancel is not None and cancel.is_set():
                    reason = "cancelled"
                    break
                usage = chunk.usage or usage
                timings = (chunk.model_extra or {}).get("timings") or timings  # Snug, llama.cpp
                for choice in chunk.choices:
                    extra = choice.delta.model_extra or {}
                    reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
                    content = choice.delta.content or ""
                    text = ""
                    if reasoning:
                        text += ("" if thinking else "<think>\n") + reasoning
                        thinking = True
                    if content:
                        text += ("\n</think>\n\n" if thinking else "") + content
                        thinking = False
                    reason = choice.finish_reason or reason
                    if text:
                        t_first = t_first or time.perf_counter()
                        yield RemoteEvent(text)
        except Exception as exc:
            raise _explain(exc, self.target.url) from exc
        finally:
            stream.close()
        tail = "\n</think>" if thinking else ""
        stats = _stats(usage, t0, t_first, timings)
        yield RemoteEvent(tail, True, reason or "stop", stats)

    def unload(self) -> None:
        self.client.close()


def _sampling(params: Any, enable_thinking: bool | None) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if enable_thinking is not None:
        extra["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
    if params is None:
        return {"extra_body": extra} if extra else {}
    out: dict[str, Any] = {
        "max_tokens": params.max_new_tokens,
        "temperature": 0.0 if params.is_greedy else params.temperature,
        "top_p": params.top_p,
    }
    if params.presence_penalty:
        out["presence_penalty"] = params.presence_penalty
    if params.seed is not None:
        out["seed"] = params.seed
    extra["top_k"] = params.top_k
    if params.min_p:
        extra["min_p"] = params.min_p
    out["extra_body"] = extra
    return out


def _stats(
    usage: Any, t0: float, t_first: float | None, timings: dict | None = None
) -> GenerationStats | None:
    """The reply's stats in the shape a local reply carries them: times as this client saw
    them; the drafts from the server's llama.cpp-style `timings`, where it sends them."""
    from engine.request_types import GenerationStats

    if usage is None:
        return None
    now, first = time.perf_counter(), t_first or time.perf_counter()
    new = usage.completion_tokens
    return GenerationStats(
        prompt_tokens=usage.prompt_tokens,
        new_tokens=new,
        ttft_s=first - t0,
        prefill_tok_s=usage.prompt_tokens / max(first - t0, 1e-9),
        decode_tok_s=(new - 1) / max(now - first, 1e-9) if new > 1 else 0.0,
        drafted=_count(timings, "draft_n"),
        drafts_kept=_count(timings, "draft_n_accepted"),
    )


def _count(timings: dict | None, key: str) -> int:
    """A non-negative count from a server's `timings` (0 where it is absent or not one)."""
    value = (timings or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class RemoteLoader:
    """A Loader (app/engine_bridge.py) that connects to the targets handed to `request_for`
    and gives every other LoadRequest to `base` (the local loader)."""

    def __init__(self, base: Callable[..., Any]) -> None:
        self.base = base
        self._targets: dict[str, RemoteTarget] = {}
        self._lock = threading.Lock()

    def request_for(self, target: RemoteTarget, settings: EngineSettings | None = None) -> Any:
        """The LoadRequest that makes the engine worker connect to `target`."""
        from app.engine_bridge import LoadRequest

        with self._lock:
            self._targets[target.key] = target
        return LoadRequest(
            model_dir=target.key,
            settings=settings or EngineSettings.from_env(),
            context=target.context or 1,
            refuse_cpu=False,  # the model runs on the server's hardware
        )

    def __call__(self, request: Any, progress: Callable[[str, float], None] | None = None) -> Any:
        with self._lock:
            target = self._targets.get(request.model_dir)
        if target is None:
            return self.base(request, progress)
        if progress is not None:
            progress(f"connecting to {target.url}", 0.0)
        engine = RemoteEngine(target)
        if progress is not None:
            progress("ready", 1.0)
        return engine
