"""What goes over the wire to an OpenAI-compatible server, and what comes back.

`base_url` makes the address a user types into the API's base (`localhost:11434` ->
`http://localhost:11434/v1`); `read_models` reads a /v1/models answer in every shape the
servers send (Ollama's `"data": null` when it has none); `StreamedReply` reads one streamed
reply line by line on a thread of its own, so that Stop ends it at once even while the
server says nothing yet (a long prompt, a model still loading), and hangs up, which tells
the server to stop; `explain` turns any failure into a sentence that names the address and
the setting to change.
"""

from __future__ import annotations

import json
import queue
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DEFAULT_URL = "http://127.0.0.1:8000/v1"
WHERE = "in Connect to a server… (Models tab)"
URL_HINT = f"check the Server URL {WHERE}: it usually ends in /v1, as http://localhost:11434/v1"
POLL_S = 0.05  # how often a reply waiting on the server looks at Stop
# A pasted endpoint ends in one of these: the base URL is what comes before it.
ENDPOINTS = ("/chat/completions", "/completions", "/models")


class RemoteError(Exception):
    """The server could not be reached or refused the request (its message is kept)."""


def base_url(text: str) -> str:
    """The API's base URL for what a user typed: a scheme where none is given, no pasted
    endpoint or trailing slash, and /v1 where the address has no path at all (every server
    this app knows of serves the API there: snug serve, Ollama, llama.cpp, vLLM, LM Studio)."""
    text = text.strip() or DEFAULT_URL
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    path = parts.path.rstrip("/")
    for tail in ENDPOINTS:
        if path.endswith(tail):
            path = path[: -len(tail)].rstrip("/")
            break
    return urlunsplit((parts.scheme, parts.netloc, path or "/v1", parts.query, ""))


def public(url: str) -> str:
    """`url` as said on screen and kept in a chat: without the password it may hold."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{parts.username}:***@{host}", *parts[2:]))


def read_models(response: Any, url: str) -> list[dict[str, Any]]:
    """[{"id", "context"}] from a GET /models answer (`response`: an httpx response);
    context is None where the server does not say (vLLM and snug serve: max_model_len)."""
    data = json_of(response, url)
    listed = data.get("data", False) if isinstance(data, dict) else False
    if listed is not None and not isinstance(listed, list):
        raise RemoteError(f"{url}/models is not a model list ({short(data)}); {URL_HINT}")
    models = []
    for entry in listed or ():  # Ollama sends "data": null when it has no model
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]:
            sizes = (entry.get(k) for k in ("max_model_len", "context_length"))
            context = next((n for n in sizes if _positive(n)), None)
            models.append({"id": entry["id"], "context": context})
    return models


def pick_model(models: list[dict[str, Any]]) -> str:
    """The model to chat with where none was named: the first listed that is no embedding
    model (LM Studio and Ollama list those among the chat models)."""
    ids = [m["id"] for m in models]
    return next((i for i in ids if "embed" not in i.lower()), ids[0] if ids else "")


def json_of(response: Any, url: str) -> Any:
    """The JSON of a server's answer, or a RemoteError that says what came instead."""
    kind = response.headers.get("content-type", "")
    text = response.text
    if "html" in kind or looks_like_html(text):
        raise RemoteError(
            f"{url} answered with a web page ({page_title(text)}), not the OpenAI API: a proxy "
            f"or a login page may stand in the way; {URL_HINT}"
        )
    try:
        return json.loads(text)
    except ValueError:
        raise RemoteError(
            f"{url} answered something other than JSON ({short(text)}); {URL_HINT}"
        ) from None


def looks_like_html(text: str) -> bool:
    return text.lstrip()[:15].lower().startswith(("<!doctype html", "<html"))


def page_title(text: str) -> str:
    found = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
    title = " ".join(found.group(1).split()) if found else ""
    return f"“{title[:80]}”" if title else "HTML"


def short(value: Any, most: int = 200) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= most else text[: most - 1] + "…"


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def server_message(body: Any, text: str = "") -> str:
    """What the server said in an error body, in each server's shape: OpenAI's and
    llama.cpp's {"error": {"message"}}, vLLM's {"message"} or {"error": "Unauthorized"},
    FastAPI's {"detail"}, or a text or web page."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            error = error.get("message") or error.get("detail") or error
        if isinstance(error, dict):
            error = body.get("message") or body.get("detail") or error
        return short(error)
    text = body if isinstance(body, str) and body else text
    return page_title(text) + " (a web page)" if looks_like_html(text) else short(text)


def explain(
    exc: BaseException, url: str, model: str = "", key: str = "", began: bool = False
) -> RemoteError:
    """`exc` as a RemoteError that names `url` and what to change. `began`: the reply had
    begun (the connection broke off mid-reply rather than never being made)."""
    import openai

    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc, url, model, key)
    reason = short(exc.__cause__ or exc) if isinstance(exc, openai.APIError) else short(exc)
    timed_out = isinstance(exc, openai.APITimeoutError) or "Timeout" in type(exc).__name__
    if began:
        what = "sent nothing for too long" if timed_out else f"broke off ({reason})"
        return RemoteError(
            f"the connection to {url} {what} in the middle of the reply; the text so far is "
            "kept. Is the server still running? (Regenerate asks again.)"
        )
    if timed_out:
        return RemoteError(
            f"{url} did not answer in time: is the server busy, or the Server URL {WHERE} wrong?"
        )
    if isinstance(exc, openai.APIConnectionError):
        return RemoteError(
            f"cannot reach {url} ({reason}); is the server running? Check the Server URL {WHERE}."
        )
    return RemoteError(f"talking to {url} failed ({type(exc).__name__}: {short(exc)})")


def _status_error(exc: Any, url: str, model: str, key: str) -> RemoteError:
    status = exc.status_code
    try:
        text = exc.response.text if exc.body is None else ""
    except Exception:  # a body that was never read
        text = ""
    message = server_message(exc.body, text)
    said = f"the server at {url} answered {status} ({message})"
    if status in (401, 403):
        what = "a key" if not key else "the right key"
        return RemoteError(f"{said}: enter {what} under API key {WHERE}")
    if status == 404 and model and "model" in message.lower():
        return RemoteError(f"{said}: it has no model “{model}”; pick one with List models {WHERE}")
    if status in (404, 405):
        return RemoteError(f"{said}: the OpenAI API is not at this address; {URL_HINT}")
    if status == 400 and any(w in message.lower() for w in ("max_tokens", "context")):
        return RemoteError(
            f"{said}: lower Max new tokens (Settings > Sampling), or start a new chat"
        )
    if status == 503:
        return RemoteError(f"{said}: it is not ready yet (loading its model?); try again soon")
    if status in (502, 504):  # a proxy's: the server behind it did not answer
        return RemoteError(
            f"{said}: a proxy stands before the server, which did not answer it; is the "
            "server running? Try again (Regenerate) once it is"
        )
    if status >= 500:
        return RemoteError(
            f"{said}: the server failed on its side (its log says why); try again "
            "(Regenerate), or restart the server"
        )
    return RemoteError(said)


Opener = Callable[[], AbstractContextManager[Any]]
_opening = threading.local()  # the StreamedReply whose request this thread is making


def watch_connection(request: Any) -> None:
    """A request hook of the chat's HTTP client: the request a StreamedReply makes reports
    the connection it opens (httpx's `trace` extension), so that Stop can hang up before
    the server's answer has begun. The client sends each reply on a connection of its own
    (`Connection: close`), so every reply opens one."""
    reply = getattr(_opening, "reply", None)
    if reply is not None:
        request.extensions["trace"] = reply.traced


class StreamedReply:
    """One streamed reply's lines, read on a thread of its own.

    `open_stream()` makes the request (the `openai` client's `with_streaming_response`);
    `lines(cancel)` yields the answer's lines as they come and returns once it ends, or at
    once when `cancel` is set: then the connection is shut, which the servers take as the
    client's leaving (they free the request's slot). Failures come out of `lines` as they
    were raised, on the caller's thread."""

    def __init__(self, url: str, open_stream: Opener) -> None:
        self.url, self._open = url, open_stream
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._response: Any = None
        self._socket: socket.socket | None = None  # the request's, before any answer
        self._closed = False
        self.began = False  # the server's answer has come (its status and headers)
        threading.Thread(target=self._read, name="snug-remote-reply", daemon=True).start()

    def traced(self, event: str, info: dict[str, Any]) -> None:
        """httpx's trace of this reply's request: the connection, once it is made."""
        if not event.endswith("connect_tcp.complete"):
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        with self._lock:
            self._socket, closed = sock, self._closed
        if closed:  # Stop came while the connection was being made
            _hang_up(sock)

    def _read(self) -> None:
        _opening.reply = self  # watch_connection hands the request's trace to `traced`
        try:
            with self._open() as response:
                with self._lock:
                    self._response = response
                    if self._closed:
                        return
                self._queue.put(("began", response))
                for line in response.iter_lines():
                    self._queue.put(("line", line))
                    if self._closed:
                        return
            self._queue.put(("end", None))
        except BaseException as exc:  # handed to the caller's thread
            self._queue.put(("error", exc))
        finally:
            _opening.reply = None

    def lines(self, cancel: threading.Event | None = None) -> Iterator[str]:
        while True:
            if cancel is not None and cancel.is_set():
                self.close()
                return
            try:
                kind, value = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "began":
                self.began = True
                check_stream(value, self.url)
            elif kind == "line":
                yield value
            elif kind == "error":
                raise value
            else:
                return

    def close(self) -> None:
        """Hang up: the reading thread ends, and the server hears the client has gone."""
        with self._lock:
            self._closed, response, sock = True, self._response, self._socket
        if response is not None:
            stream = response.http_response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else sock
        # No answer yet (a long prompt, a model loading): the request's own connection, where
        # `traced` saw it made; else the reading thread closes it once the server answers.
        _hang_up(sock)


def _hang_up(sock: Any) -> None:
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the reading thread at once
        except OSError:  # closed already
            pass


def check_stream(response: Any, url: str) -> None:
    """Refuse an answer that is no event stream: a web page (a proxy, a login page)."""
    if "html" in response.headers.get("content-type", ""):
        raise RemoteError(
            f"{url} answered with a web page, not the OpenAI API: a proxy or a login page "
            f"may stand in the way; {URL_HINT}"
        )


class Events:
    """The JSON chunks of a server-sent event stream (iterate it); `done` once the server
    has said `data: [DONE]`. An error the server sends in the stream (vLLM's
    `data: {"error"}`, llama.cpp's `error:` line) is raised with its message. A whole JSON
    answer (a server that does not stream) is taken as one chunk."""

    def __init__(self, lines: Iterator[str], url: str) -> None:
        self.lines, self.url, self.done = lines, url, False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        url, body = self.url, []
        for raw in self.lines:
            line = raw.strip()
            field, _, value = line.partition(":")
            value = value.strip()
            if field == "data" and value == "[DONE]":
                self.done = True
                return
            if field in ("data", "error") and value:
                chunk = _load(value)
                if field == "error" or (isinstance(chunk, dict) and chunk.get("error")):
                    error = chunk.get("error", chunk) if isinstance(chunk, dict) else chunk
                    said = server_message({"error": error}, value)
                    raise RemoteError(f"the server at {url} stopped the reply: {said}")
                if isinstance(chunk, dict):
                    yield chunk
            elif line and field not in ("event", "id", "retry", ""):
                body.append(raw)
        if body:
            yield self._whole("\n".join(body))

    def _whole(self, text: str) -> dict[str, Any]:
        whole = _load(text)
        if isinstance(whole, dict) and whole.get("error"):
            raise RemoteError(
                f"the server at {self.url} refused the reply: {server_message(whole)}"
            )
        if not isinstance(whole, dict) or not isinstance(whole.get("choices"), list):
            said = server_message(whole, text)
            raise RemoteError(
                f"the server at {self.url} answered no event stream ({said}); {URL_HINT}"
            )
        for choice in whole["choices"]:
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict):
                choice.setdefault("delta", choice["message"])
        self.done = True
        return whole


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
