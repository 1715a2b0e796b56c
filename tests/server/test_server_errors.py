"""Bad requests get a 4xx in OpenAI's error shape, with a message, while a stream that is
running goes on undisturbed; the server refuses to listen on the network without a key."""

import asyncio
import gzip
import json
import socket
import subprocess
import sys
import threading
import time
import zlib

import httpx
import openai
import pytest

from engine.cli import main as cli_main
from engine.scheduler import Scheduler
from engine.server.app import MAX_BODY, create_app
from tests.server.conftest import serve

KEY_HEADER = {"Authorization": "Bearer test-key"}
USER = [{"role": "user", "content": "Hello"}]
OFF = {"enable_thinking": False}


def chat(**fields):
    return {"model": "tiny-tools", "messages": USER, **fields}


# (method, path, body (dict, or raw bytes), status, param, code, words in the message)
CASES = [
    ("POST", "/chat/completions", b"{not json", 400, None, "invalid_json", "not valid JSON"),
    ("POST", "/chat/completions", b"[1, 2]", 400, None, "invalid_json", "JSON object"),
    ("POST", "/chat/completions", chat(temperature="hot"), 400, "temperature", None, "number"),
    ("POST", "/chat/completions", chat(max_tokens="10"), 400, "max_tokens", None, "integer"),
    ("POST", "/chat/completions", chat(max_tokens=0), 400, "max_tokens", None, "at least 1"),
    ("POST", "/chat/completions", chat(stream="yes"), 400, "stream", None, "boolean"),
    ("POST", "/chat/completions", chat(stop=5), 400, "stop", None, "string"),
    ("POST", "/chat/completions", b"[" * 50000 + b"]" * 50000, 400, None, "invalid_json", "JSON"),
    ("POST", "/chat/completions", chat(top_p=1.5), 400, "top_p", None, "[0, 1]"),
    (
        "POST",
        "/chat/completions",
        b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}',
        400,
        "temperature",
        None,
        "must be in",
    ),  # fmt: skip
    ("POST", "/chat/completions", chat(seed=2**64), 400, "seed", None, "must be in"),
    ("POST", "/chat/completions", chat(n=0), 400, "n", None, "at least 1"),
    ("POST", "/chat/completions", chat(n=500), 400, "n", None, "or the streams (--streams)"),
    ("POST", "/completions", {"prompt": ["a", "b"] * 40}, 400, "n", None, "80 replies"),
    ("POST", "/completions", {"prompt": "hi", "n": 2, "best_of": 3}, 400, "best_of", None, "equal"),
    ("POST", "/completions", {"prompt": ["hi", ""]}, 400, "prompt", None, "prompt[1]"),
    ("POST", "/chat/completions", chat(top_logprobs=3), 400, "top_logprobs", None, "needs"),
    (
        "POST",
        "/chat/completions",
        chat(logprobs=True, top_logprobs=21),
        400,
        "top_logprobs",
        None,
        "[0, 20]",
    ),  # fmt: skip
    ("POST", "/completions", {"prompt": "hi", "logprobs": -1}, 400, "logprobs", None, "[0, 20]"),
    (
        "POST",
        "/chat/completions",
        chat(tool_choice="required"),
        400,
        "tool_choice",
        None,
        "no 'tools'",
    ),
    ("POST", "/chat/completions", {"model": "tiny-tools"}, 400, "messages", None, "non-empty"),
    (
        "POST",
        "/chat/completions",
        chat(messages=[{"role": "robot", "content": "hi"}]),
        400,
        "messages[0].role",
        None,
        "one of",
    ),
    (
        "POST",
        "/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        400,
        "messages[0].content",
        None,
        "text and file",
    ),
    (
        "POST",
        "/chat/completions",
        chat(chat_template_kwargs={"enable_thinking": "no"}),
        400,
        "chat_template_kwargs.enable_thinking",
        None,
        "boolean",
    ),
    (
        "POST",
        "/chat/completions",
        chat(messages=[{"role": "user", "content": "word " * 2000}]),
        400,
        "messages",
        "context_length_exceeded",
        "context is 1024",
    ),
    (
        "POST",
        "/chat/completions",
        chat(max_tokens=5000),
        400,
        "max_tokens",
        "context_length_exceeded",
        "ask for at most",
    ),
    ("POST", "/chat/completions", chat(model="gpt-4o"), 404, "model", "model_not_found", "gpt-4o"),
    (
        "POST",
        "/chat/completions",
        chat(
            messages=[
                *USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{'x'"},
                        }
                    ],
                },
            ]
        ),
        400,
        "messages[1].tool_calls[0].function.arguments",
        None,
        "JSON object",
    ),  # fmt: skip
    ("POST", "/completions", {"prompt": [1, 99999]}, 400, "prompt", None, "vocabulary"),
    ("POST", "/completions", {"prompt": ""}, 400, "prompt", None, "non-empty"),
    ("POST", "/completions", {"prompt": "hi", "echo": True}, 400, "echo", None, "not supported"),
    ("POST", "/embeddings", {"input": "hi"}, 404, None, "not_found", "no embedding model"),
    ("POST", "/audio/speech", {"input": "hi"}, 404, None, "not_found", "no route"),
    ("GET", "/chat/completions", None, 405, None, "method_not_allowed", "not allowed"),
    ("GET", "/models/other", None, 404, "model", "model_not_found", "other"),
]


def test_bad_requests_get_4xx_and_a_running_stream_goes_on(served, solo):
    expected = solo(USER, 40, thinking=False).lstrip("\n").rstrip()
    got: list[str] = []

    def running_stream() -> None:
        stream = served.client().chat.completions.create(
            model=served.model,
            messages=USER,
            max_tokens=40,
            temperature=0,
            stream=True,
            extra_body={"chat_template_kwargs": OFF},
        )
        got.append("".join(c.choices[0].delta.content or "" for c in stream))

    thread = threading.Thread(target=running_stream)
    thread.start()
    with httpx.Client(base_url=served.url, headers=KEY_HEADER, timeout=30) as http:
        for method, path, body, status, param, code, words in CASES:
            if isinstance(body, bytes):
                response = http.request(method, path, content=body)
            else:
                response = http.request(method, path, json=body)
            assert response.status_code == status, (path, body, response.text)
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert words in error["message"], (words, error)
            assert error["param"] == param and error["code"] == code, error
    thread.join(60)
    assert got == [expected]


def test_body_size_and_keys(served):
    with httpx.Client(base_url=served.url, timeout=30) as http:
        big = http.post(
            "/chat/completions",
            headers=KEY_HEADER,
            content=b'{"messages": "' + b"x" * (MAX_BODY + (1 << 20)) + b'"}',
        )
        assert big.status_code == 413 and f"larger than {MAX_BODY} bytes" in big.text
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
            response = http.get("/models", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert "--api-key" in response.json()["error"]["message"]
        assert http.get(f"{served.base}/health").status_code == 200  # no key needed
    with pytest.raises(openai.AuthenticationError):
        served.client(key="wrong").models.list()
    with pytest.raises(openai.NotFoundError, match="is not loaded here"):
        served.client().chat.completions.create(model="nope", messages=USER)


def test_serve_refuses_the_network_without_a_key(tiny_checkpoint, capsys):
    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    assert cli_main(["serve", "--model", str(model), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "UnsafeBind" in err and "--api-key" in err and "0.0.0.0" in err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_snug_serve_runs_as_a_command(tiny_checkpoint):
    model = tiny_checkpoint("tied-l4-r1", "hf-fp32")
    port = free_port()
    args = ["serve", "--model", str(model), "--port", str(port), "--backend", "numpy"]
    args += ["--context", "512", "--streams", "1", "--queue", "0"]
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        reply = client.completions.create(model=model.name, prompt="Hello", max_tokens=4)
        assert reply.usage.completion_tokens == 4
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert f"serving {model.name} on http://127.0.0.1:{port}/v1" in output


class Failing(Scheduler):
    """A decode step that fails as a bug or the card's own allocator would (not a SnugError)
    once its request has three tokens."""

    def _next_tokens(self, batch):
        if any(len(r.generated) >= 3 for r in batch):
            raise RuntimeError("the step failed")
        return super()._next_tokens(batch)


@pytest.fixture(scope="module")
def failing(light_checkpoint):
    s = serve(light_checkpoint, Failing, streams=2, queue=2)
    yield s
    s.server.stop()
    s.scheduler.close()


def test_a_reply_that_fails_mid_stream_ends_with_an_error_in_its_apis_shape(failing):
    """The stream is not cut: its API's error event (500, the exception's type), then its
    terminator; a whole reply's 500 comes in its API's shape too."""
    user = [{"role": "user", "content": "Hi"}]
    ask = {"max_tokens": 20, "ignore_eos": True}
    with httpx.Client(base_url=failing.base, headers=KEY_HEADER, timeout=30) as http:
        text = http.post("/v1/chat/completions", json={**ask, "messages": user, "stream": True})
        events = [line[6:] for line in text.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert (
            error["type"] == "server_error" and "RuntimeError: the step failed" in error["message"]
        )
        text = http.post("/v1/messages", json={**ask, "messages": user, "stream": True}).text
        lines = text.rstrip().splitlines()
        assert lines[-2] == "event: error"
        assert json.loads(lines[-1][6:])["error"]["type"] == "api_error"
        text = http.post("/api/generate", json={**ask, "prompt": "Hi"}).text
        assert "RuntimeError" in json.loads(text.splitlines()[-1])["error"]
        whole = http.post("/v1/messages", json={**ask, "messages": user})
        assert whole.status_code == 500 and whole.json()["type"] == "error"
        assert "RuntimeError" in whole.json()["error"]["message"]
    failing.wait_idle()
    assert sorted(failing.engine._free_slots) == [0, 1]


def test_compressed_and_mislabelled_bodies(served):
    """gzip and deflate bodies are read (within the size limit, counted inflated); another
    encoding, a broken gzip, a form body are refused saying what was sent."""
    body = json.dumps({"prompt": "Hi", "max_tokens": 2, "ignore_eos": True}).encode()
    with httpx.Client(base_url=served.url, headers=KEY_HEADER, timeout=30) as http:
        for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
            r = http.post("/completions", content=data, headers={"Content-Encoding": encoding})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
        r = http.post("/completions", content=body, headers={"Content-Encoding": "br"})
        assert r.status_code == 415 and "'br' is not supported" in r.json()["error"]["message"]
        r = http.post("/completions", content=body, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_encoding"
        bomb = gzip.compress(b" " * (MAX_BODY + 1))  # 32 KiB that inflate past the limit
        r = http.post("/completions", content=bomb, headers={"Content-Encoding": "gzip"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        r = http.post("/completions", data={"prompt": "Hi"})
        assert r.status_code == 400
        assert "sent as application/x-www-form-urlencoded" in r.json()["error"]["message"]


def test_a_body_cut_short_is_a_400_not_a_server_error(served):
    """A client that hangs up before its body is whole: the app answers 400 (no exception
    escapes it for the server to log as a crash)."""
    app = create_app(served.scheduler, api_key="test-key")
    sent: list[dict] = []
    parts = [
        {"type": "http.request", "body": b'{"messages"', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict:
        return parts.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", b"Bearer test-key"), (b"content-length", b"100")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["code"] == "incomplete_body"


@pytest.mark.parametrize(
    ("path", "allowed", "shape"),
    [
        ("/v1/chat/completions", "POST", "openai"),
        ("/v1/messages", "POST", "anthropic"),
        ("/api/chat", "POST", "ollama"),
        ("/v1/models", "GET, HEAD", "openai"),
        ("/health", "GET, HEAD", "openai"),
    ],
)
def test_methods_a_route_does_not_take(served, path, allowed, shape):
    """405 names the methods in `Allow` and in its message, in the route's API's shape;
    OPTIONS answers 204 with them; HEAD answers as GET without a body, or 405."""
    with httpx.Client(base_url=served.base, headers=KEY_HEADER, timeout=30) as http:
        r = http.put(path)
        assert r.status_code == 405 and r.headers["allow"] == allowed
        got = r.json()
        message = {"openai": lambda: got["error"]["message"], "ollama": lambda: got["error"],
                   "anthropic": lambda: got["error"]["message"]}[shape]()  # fmt: skip
        assert f"use {allowed}" in message and (got.get("type") == "error") == (
            shape == "anthropic"
        )
        r = http.options(path)
        assert r.status_code == 204 and r.headers["allow"] == f"{allowed}, OPTIONS"
        r = http.head(path)
        assert r.content == b"" and r.status_code == (200 if "HEAD" in allowed else 405)
