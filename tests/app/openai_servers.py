"""Stand-ins for the OpenAI-compatible servers people point the app at, on 127.0.0.1 only.

Each flavour answers as that server does on the wire (bodies, status codes, error shapes,
how it streams), from what each one sends:

    ollama     /v1/models with "data": null when it has no model; "reasoning" deltas;
               no chat_template_kwargs: a thinking model thinks unless `reasoning.effort`
               (read first, where given) or `reasoning_effort` is "none", and any value but
               "high", "medium", "low" or "none" is a 400 {"error"} that names them; usage
               only with stream_options.include_usage; 404 {"error"} for an unknown model;
               GET /api/version answers {"version": "0.12.6"}; a plain-text
               "404 page not found" for an unknown route; no API keys
    llamacpp   one model, listed with "meta" (and /models open without the key);
               "reasoning_content" deltas; "timings" in the last chunks; errors as
               {"error": {"code", "message", "type"}}; 503 "Loading model" while it loads;
               a failure mid-stream as an `error: {...}` line, then `data: [DONE]`
    vllm       "max_model_len" in /v1/models; "reasoning_content" and "reasoning" deltas;
               "usage": null in each chunk and a last chunk of usage with include_usage;
               401 {"error": "Unauthorized"}; 404 {"object": "error", "message"}
    lmstudio   "publisher/model" ids with an embedding model listed first; "reasoning"
    portal     a captive portal or proxy: a login web page for every request

Switches, set after construction: `loading` (llama.cpp's 503), `stall_s` (nothing sent
for that long before the answer, then the reply), `pause_after` (chunks sent before it
stalls the rest of `stall_s`), `cut_after` (chunks sent before the connection drops),
`end_early_after` (chunks sent before a clean end without finish_reason or [DONE]),
`fail_after` (chunks before a mid-stream error), `chat_status` (a status every chat
request is answered with, as nginx's web page: 502 for a server behind it that is down),
`slow_list_s`, `context` (vLLM's
--max-model-len: a request for more tokens than it leaves is a 400), `version` (what Ollama's
GET /api/version answers, after `stall_s`: JSON, or a text such as PORTAL, sent as a web
page; None: no such route). `requests` records each request's (method, path, JSON body,
Authorization); `hung_up` is set once a client closed the connection of a reply still being
sent.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PORTAL = (
    "<!DOCTYPE html><html><head><title>Hotel Wi-Fi: sign in</title></head>"
    "<body><form>Room number <input name=room></form></body></html>"
)


def ollama_effort(body: Any) -> Any:
    """The reasoning effort an Ollama chat request asks for, read as Ollama's openai.go reads
    it: `reasoning.effort` where `reasoning` is given, else `reasoning_effort`; "" for none."""
    if not isinstance(body, dict):
        return ""
    reasoning = body.get("reasoning")
    if reasoning is not None:
        return (reasoning.get("effort") if isinstance(reasoning, dict) else None) or ""
    return body.get("reasoning_effort") or ""


class Quiet(ThreadingHTTPServer):
    """A client hanging up (Stop, a test's end) is part of the game, not an error to print."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeServer:
    def __init__(
        self,
        flavour: str,
        models: list[str] | None = None,
        key: str | None = None,
        thinking: str = "Let me think.",
        answer: str = "Hello there!",
    ) -> None:
        self.flavour = flavour
        self.models = models if models is not None else ["model-a"]
        self.key = key
        self.thinking, self.answer = thinking, answer
        self.loading = False
        self.stall_s = 0.0
        self.pause_after: int | None = None
        self.cut_after: int | None = None
        self.end_early_after: int | None = None
        self.fail_after: int | None = None
        self.chat_status: int | None = None
        self.slow_list_s = 0.0
        self.context = 32768  # vLLM's --max-model-len
        self.version: Any = {"version": "0.12.6"}  # Ollama's GET /api/version
        self.requests: list[tuple[str, str, Any, str]] = []
        self.hung_up = threading.Event()
        self._server = Quiet(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def url(self) -> str:
        return self.root + "/v1"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def chats(self) -> list[Any]:
        return [body for method, path, body, _ in self.requests if path.endswith("/completions")]

    # -- what each server answers
    def listing(self) -> dict[str, Any]:
        now = int(time.time())
        if self.flavour == "ollama":
            data = [
                {"id": m, "object": "model", "created": now, "owned_by": "library"}
                for m in self.models
            ]
            return {"object": "list", "data": data or None}  # Go: a nil slice is null
        if self.flavour == "llamacpp":
            meta = {"vocab_type": 2, "n_vocab": 151936, "n_ctx_train": 40960, "n_embd": 2560}
            return {
                "models": [{"name": m, "model": m, "type": "model"} for m in self.models],
                "object": "list",
                "data": [
                    {
                        "id": m,
                        "object": "model",
                        "created": now,
                        "owned_by": "llamacpp",
                        "meta": meta,
                    }
                    for m in self.models
                ],
            }
        if self.flavour == "vllm":
            data = [
                {
                    "id": m,
                    "object": "model",
                    "created": now,
                    "owned_by": "vllm",
                    "root": m,
                    "parent": None,
                    "max_model_len": self.context,
                    "permission": [{"object": "model_permission", "allow_sampling": True}],
                }
                for m in self.models
            ]
            return {"object": "list", "data": data}
        data = [{"id": m, "object": "model", "owned_by": "organization_owner"} for m in self.models]
        return {"data": data, "object": "list"}

    def refusal(self, path: str, auth: str, body: Any) -> tuple[int, Any] | None:
        """The error this server answers the request with, if any: (status, JSON or text)."""
        f = self.flavour
        if f == "llamacpp" and self.loading:
            return 503, {
                "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
            }
        open_route = f == "llamacpp" and path.endswith("/models")
        if self.key is not None and auth != f"Bearer {self.key}" and not open_route:
            if f == "vllm":
                return 401, {"error": "Unauthorized"}
            return 401, {
                "error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
            }
        known = ("/v1/models", "/v1/chat/completions") + (
            ("/models", "/chat/completions") if f == "llamacpp" else ()
        )
        if f == "ollama" and self.version is not None:
            known += ("/api/version",)
        if path not in known:
            if f == "ollama":
                return 404, "404 page not found"
            if f == "vllm":
                return 404, {"detail": "Not Found"}
            if f == "lmstudio":
                return 200, {"error": f"Unexpected endpoint or method. (GET {path})"}
            return 404, {
                "error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}
            }
        effort = ollama_effort(body) if f == "ollama" and path.endswith("/completions") else ""
        if effort not in ("", "high", "medium", "low", "none"):
            message = (
                f"invalid reasoning value: '{effort}' "
                '(must be "high", "medium", "low", or "none")'
            )
            return 400, {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
        model = body.get("model") if isinstance(body, dict) else None
        wanted = (body or {}).get("max_tokens") or 0
        if f == "vllm" and path.endswith("/completions") and 12 + wanted > self.context:
            message = (
                f"This model's maximum context length is {self.context} tokens. However, you "
                f"requested {12 + wanted} tokens (12 in the messages, {wanted} in the "
                "completion). Please reduce the length of the messages or completion."
            )
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            return 400, {"object": "error", **error}
        if path.endswith("/completions") and model not in self.models and f != "llamacpp":
            if f == "ollama":
                message = f'model "{model}" not found, try pulling it first'
                return 404, {
                    "error": {
                        "message": message,
                        "type": "not_found_error",
                        "param": None,
                        "code": None,
                    }
                }
            if f == "vllm":
                message = f"The model `{model}` does not exist."
                return 404, {
                    "object": "error",
                    "message": message,
                    "type": "NotFoundError",
                    "param": None,
                    "code": 404,
                }
            return 404, {
                "error": {"message": f'Model "{model}" not found', "type": "invalid_request_error"}
            }
        return None

    def chunks(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The reply's chunks in this server's shape: thinking, then the answer (a word a
        chunk), the finish, and usage where asked for."""
        f, model = self.flavour, body.get("model")
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": model}
        if f == "ollama":
            base["system_fingerprint"] = "fp_ollama"
        field = {"ollama": "reasoning", "lmstudio": "reasoning"}.get(f, "reasoning_content")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            if f == "vllm":
                choice["logprobs"] = None
            out = {**base, "choices": [choice]}
            if f == "vllm" and usage_asked:
                out["usage"] = None
            return out

        usage_asked = bool((body.get("stream_options") or {}).get("include_usage"))
        out = []
        # Ollama takes no chat_template_kwargs (a thinking model thinks unless its effort is
        # "none"); the others do.
        if f == "ollama":
            thinking = ollama_effort(body) != "none"
        else:
            thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        if thinking and self.thinking:
            for word in self.thinking.split(" "):
                delta = {field: word + " "}
                if f == "vllm":
                    delta["reasoning"] = word + " "  # newer vLLM sends both
                out.append(chunk(delta))
        for word in self.answer.split(" "):
            out.append(chunk({"role": "assistant", "content": word + " "}))
        words = len(out)
        last = chunk({}, "stop")
        timings = {"prompt_n": 12, "prompt_ms": 30.0, "predicted_n": words, "predicted_ms": 90.0}
        if f == "llamacpp":
            last["timings"] = timings
        out.append(last)
        if usage_asked:
            usage = {"prompt_tokens": 12, "completion_tokens": words, "total_tokens": 12 + words}
            tail = {**base, "choices": [], "usage": usage}
            if f == "llamacpp":
                tail["timings"] = timings
            out.append(tail)
        return out

    # -- HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def answer(self, status: int, body: Any, kind: str = "application/json") -> None:
                data = body if isinstance(body, str) else json.dumps(body)
                if isinstance(body, str) and kind == "application/json":
                    kind = "text/plain; charset=utf-8"
                raw = data.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def handle_request(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                auth = self.headers.get("Authorization", "")
                path = self.path.partition("?")[0]
                fake.requests.append((method, path, body, auth))
                if fake.flavour == "portal":
                    return self.answer(200, PORTAL, "text/html; charset=utf-8")
                refused = fake.refusal(path, auth, body)
                if refused is not None:
                    return self.answer(*refused)
                if fake.chat_status and path.endswith("/completions"):
                    page = f"<html><head><title>{fake.chat_status} Error</title></head></html>"
                    return self.answer(fake.chat_status, page, "text/html")
                if path.endswith("/models"):
                    time.sleep(fake.slow_list_s)
                    return self.answer(200, fake.listing())
                if fake.stall_s and fake.pause_after is None and self.wait_or_gone(fake.stall_s):
                    return
                if path == "/api/version":
                    page = isinstance(fake.version, str)
                    kind = "text/html; charset=utf-8" if page else "application/json"
                    return self.answer(200, fake.version, kind)
                self.stream(fake.chunks(body))

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.handle_request("GET")

            def do_POST(self) -> None:  # noqa: N802
                self.handle_request("POST")

            def send_chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def wait_or_gone(self, seconds: float) -> bool:
                """Wait `seconds`; True (and `hung_up` set) where the client hangs up."""
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    readable, _, _ = select.select([self.connection], [], [], 0.02)
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        fake.hung_up.set()
                        self.close_connection = True
                        return True
                return False

            def stream(self, chunks: list[dict[str, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                for i, chunk in enumerate(chunks):
                    if i == fake.pause_after and self.wait_or_gone(fake.stall_s):
                        return
                    if i == fake.cut_after:
                        self.connection.shutdown(socket.SHUT_RDWR)  # no last chunk: cut off
                        self.close_connection = True
                        return
                    if i == fake.end_early_after:
                        break
                    if i == fake.fail_after:
                        error = {
                            "code": 500,
                            "message": "the KV cache is full",
                            "type": "server_error",
                        }
                        self.send_chunk(b"error: " + json.dumps(error).encode() + b"\n\n")
                        self.send_chunk(b"data: [DONE]\n\n")
                        break
                    self.send_chunk(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                else:
                    self.send_chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler
