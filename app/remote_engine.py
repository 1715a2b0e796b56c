"""A model that runs elsewhere: any OpenAI-compatible server, through the `openai` client.

`RemoteEngine` has the shape the engine worker uses of a local Engine (app/engine_bridge.py's
EngineLike): `chat_ids` returns an opaque `RemotePrompt` (the messages; the server applies
the template), `generate` streams chat completions and yields events with `text`,
`finished`, `finish_reason` and `stats`. The server's thinking (`reasoning_content` or
`reasoning`) comes back wrapped in <think>...</think>, as a local model writes it, so the chat
shows it the same way. The Thinking switch goes as `chat_template_kwargs`, which snug serve,
llama.cpp, vLLM and SGLang read; Ollama ignores it and reads `reasoning_effort` instead, so a
server that answers as Ollama (`server_kind`, asked once when the engine is made) also gets
thinking off as `reasoning_effort: "none"`; another Snug gets the thinking budget as its
`thinking_budget`. It holds no memory here: `held_bytes()` is 0 and `backend_name` is
"remote", so the gauge can say the model runs elsewhere. What goes over the wire, and how
each failure is said: app/remote_wire.py.

`RemoteLoader` plugs it into the app's load path: a Loader that loads the targets it was
given (`request_for`) as RemoteEngines and passes every other request to the local loader.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from app.remote_wire import (
    DEFAULT_URL,
    WHERE,
    Events,
    RemoteError,
    StreamedReply,
    base_url,
    explain,
    pick_model,
    public,
    read_models,
    watch_connection,
)
from engine.config import EngineSettings

if TYPE_CHECKING:
    from engine.request_types import GenerationStats

__all__ = [
    "DEFAULT_URL",
    "RemoteEngine",
    "RemoteError",
    "RemoteLoader",
    "RemoteTarget",
    "server_kind",
    "list_models",
    "model_of_key",
]
CONNECT_S = 10.0  # the most a connection to the server may take to be made
PROBE_S = 3.0  # the most the question "is the server Ollama?" may take; no answer: it is not


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


def _client(url: str, api_key: str, timeout: float, replies: bool = False) -> Any:
    """An OpenAI client for `url`; `replies`: the chat's, whose every reply goes on a
    connection of its own that Stop can close before the answer begins (app/remote_wire.py's
    watch_connection)."""
    try:
        from openai import DefaultHttpxClient, OpenAI, Timeout
    except ImportError as exc:
        raise RemoteError(
            "talking to a server needs the `openai` package: pip install openai"
        ) from exc
    api_key = sendable_key(api_key)
    limit = Timeout(timeout, connect=min(timeout, CONNECT_S))
    extra: dict[str, Any] = {}
    if replies:
        extra["http_client"] = DefaultHttpxClient(event_hooks={"request": [watch_connection]})
        extra["default_headers"] = {"Connection": "close"}
    return OpenAI(base_url=url, api_key=api_key or "none", max_retries=0, timeout=limit, **extra)


def sendable_key(api_key: str) -> str:
    """`api_key` as it can go in the Authorization header: without a pasted "Bearer " (the
    client writes its own); a key holding a character no header can carry (a line break, a
    letter from outside ASCII, an invisible space copied from a web page) is a RemoteError
    that says so, not a failure to reach the server."""
    key = api_key.strip()
    if key[:7].lower() == "bearer ":
        key = key[7:].strip()
    odd = next((c for c in key if not (c.isascii() and c.isprintable())), None)
    if odd is not None:
        raise RemoteError(
            f"the API key holds a character that cannot be sent ({ascii(odd)[1:-1]}): paste "
            f"the key again under API key {WHERE}, with nothing before or after it"
        )
    return key


def list_models(url: str, api_key: str = "", timeout: float = 10.0) -> list[dict[str, Any]]:
    """The server's models: [{"id", "context"}] (context None when the server does not say).
    `url` as typed: app/remote_wire.py's base_url makes it the API's base."""
    url = base_url(url)
    client, shown = _client(url, api_key, timeout), public(url)
    try:
        return read_models(client.models.with_raw_response.list().http_response, shown)
    except Exception as exc:
        raise explain(exc, shown, key=api_key) from exc
    finally:
        client.close()


def server_kind(url: str, api_key: str = "") -> str:
    """ "ollama" or "snug" for a server whose API at `url` (a base URL, as `base_url` makes
    it) says it is one, else "": both answer GET /api/version beside their /v1, Ollama with
    {"version": "0.x.y"}, snug serve (which speaks Ollama's API as well) with a
    "snug_version" beside. Any other answer (an error status, a web page, no JSON, no
    version that is a string) or none within PROBE_S is "": the question never fails the
    connection."""
    parts = urlsplit(url)
    if not parts.path.endswith("/v1"):
        return ""  # both serve the OpenAI API at /v1
    root = urlunsplit(parts._replace(path=parts.path.removesuffix("/v1"), query=""))
    client, body = None, None
    try:
        client = _client(root, api_key, PROBE_S)
        # cast_to=object: the JSON as it came (or the text, where the answer is no JSON)
        body = client.get("/api/version", cast_to=object)
    except Exception:  # no answer, an error status, a broken body: neither
        return ""
    finally:
        if client is not None:
            client.close()
    said = body if isinstance(body, dict) else {}
    if not isinstance(said.get("version"), str):
        return ""
    return "snug" if "snug_version" in said else "ollama"


class RemoteEngine:
    """Streams chat completions from `target`'s server; see the module docstring. Making one
    asks the server for its models: a wrong address or key fails here, by name, rather than
    at the first message; then whether it is Ollama, which reads the Thinking switch in a
    field of its own, or another Snug, which holds the thinking to a budget (`kind`)."""

    backend_name = "remote"
    decision = None

    def __init__(self, target: RemoteTarget, timeout: float = 600.0) -> None:
        self.target = target
        self.url = base_url(target.url)
        self.shown = public(self.url)  # the address as messages say it
        models = list_models(self.url, target.api_key)
        if not models and not target.model:
            raise RemoteError(
                f"the server at {self.shown} lists no models: load or pull one there first "
                "(as `ollama pull NAME`), or name the model in Connect to a server…"
            )
        self.model = target.model or pick_model(models)
        listed = {m["id"]: m["context"] for m in models}
        # The context the server runs the model with, where it says (None: unknown).
        self.served_context = target.context or listed.get(self.model)
        self.kind = server_kind(self.url, target.api_key)
        self.client = _client(self.url, target.api_key, timeout, replies=True)

    @property
    def ollama(self) -> bool:
        return self.kind == "ollama"

    @property
    def takes_thinking_budget(self) -> bool:
        """Whether the server holds a reply's thinking to a budget (`generate`'s)."""
        return self.kind == "snug"

    def held_bytes(self) -> int:
        return 0

    def chat_ids(
        self, messages: list[dict[str, Any]], enable_thinking: bool | None = None
    ) -> RemotePrompt:
        return RemotePrompt(tuple(dict(m) for m in messages), enable_thinking)

    def generate(
        self,
        prompt: RemotePrompt,
        params: Any = None,
        cancel: threading.Event | None = None,
        thinking_budget: int = 0,
    ) -> Iterator[RemoteEvent]:
        """Stream one reply. `params`: the app's GenerationParams (None: server defaults).
        Setting `cancel` ends it at once and closes the connection, which frees the
        server's slot. `thinking_budget`: sent where the server takes it (another Snug's
        `thinking_budget`) and the reply thinks."""
        t0 = time.perf_counter()
        extra = _sampling(params, prompt.enable_thinking, self.ollama)
        if thinking_budget > 0 and self.takes_thinking_budget and prompt.enable_thinking:
            extra.setdefault("extra_body", {})["thinking_budget"] = thinking_budget
        reply = StreamedReply(
            self.shown,
            lambda: self.client.chat.completions.with_streaming_response.create(
                model=self.model,
                messages=list(prompt.messages),
                stream=True,
                stream_options={"include_usage": True},
                **extra,
            ),
        )
        thinking, reason, usage, t_first, timings = False, None, None, None, {}
        stream = Events(reply.lines(cancel), self.shown)
        try:
            for chunk in stream:
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings  # Snug, llama.cpp
                choices = chunk.get("choices")
                for choice in choices if isinstance(choices, list) else ():
                    if not isinstance(choice, dict):
                        continue
                    delta = choice.get("delta")
                    delta = delta if isinstance(delta, dict) else {}
                    reasoning = _text(delta, "reasoning_content") or _text(delta, "reasoning")
                    content = _text(delta, "content")
                    text = ""
                    if reasoning:
                        text += ("" if thinking else "<think>\n") + reasoning
                        thinking = True
                    if content:
                        text += ("\n</think>\n\n" if thinking else "") + content
                        thinking = False
                    reason = choice.get("finish_reason") or reason
                    if text:
                        t_first = t_first or time.perf_counter()
                        yield RemoteEvent(text)
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
            elif reason is None and not stream.done:
                raise RemoteError(
                    f"the server at {self.shown} ended the reply before it was finished; the "
                    "text so far is kept. Is the server still running? (Regenerate asks again.)"
                )
        except Exception as exc:
            raise explain(exc, self.shown, self.model, self.target.api_key, reply.began) from exc
        finally:
            reply.close()
        tail = "\n</think>" if thinking else ""
        stats = _stats(usage, t0, t_first, timings)
        yield RemoteEvent(tail, True, reason or "stop", stats)

    def unload(self) -> None:
        self.client.close()


def _text(delta: dict[str, Any], key: str) -> str:
    value = delta.get(key)
    return value if isinstance(value, str) else ""


def _sampling(params: Any, enable_thinking: bool | None, ollama: bool = False) -> dict[str, Any]:
    """The request's fields for `params` (the app's GenerationParams; None: the server's
    defaults) and the Thinking switch (None: not set). The switch goes as
    chat_template_kwargs to every server; to Ollama (`ollama`), which ignores those, thinking
    off also goes as reasoning_effort "none". Thinking on asks no effort of it: Ollama's
    thinking models think unless told not to, at their own level. No other server gets
    reasoning_effort: some vLLM versions refuse "none" with a 400."""
    extra: dict[str, Any] = {}
    if enable_thinking is not None:
        extra["chat_template_kwargs"] = {"enable_thinking": enable_thinking}
    if ollama and enable_thinking is False:
        extra["reasoning_effort"] = "none"
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
    them; the token counts from `usage`, else from llama.cpp-style `timings` (prompt_n,
    predicted_n); the drafts from `timings`, where the server sends them."""
    from engine.request_types import GenerationStats

    prompt = _count(usage, "prompt_tokens", _count(timings, "prompt_n", None))
    new = _count(usage, "completion_tokens", _count(timings, "predicted_n", None))
    if prompt is None or new is None:
        return None
    now = time.perf_counter()
    first = t_first or now  # no text came: no rate of it either
    return GenerationStats(
        prompt_tokens=prompt,
        new_tokens=new,
        ttft_s=first - t0,
        prefill_tok_s=prompt / max(first - t0, 1e-9),
        decode_tok_s=(new - 1) / max(now - first, 1e-9) if new > 1 and t_first else 0.0,
        drafted=_count(timings, "draft_n") or 0,
        drafts_kept=_count(timings, "draft_n_accepted") or 0,
    )


def _count(source: Any, key: str, default: int | None = 0) -> int | None:
    """A non-negative count from a server's `usage` or `timings` (a dict or an object), or
    `default` where it is absent or not one."""
    value = source.get(key) if isinstance(source, dict) else getattr(source, key, None)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else default


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
            progress(f"connecting to {public(base_url(target.url))}", 0.0)
        engine = RemoteEngine(target)
        if progress is not None:
            progress("ready", 1.0)
        return engine
