"""The remote engine against stand-ins for the servers people point the app at (Ollama,
llama.cpp's llama-server, vLLM, LM Studio: tests/app/openai_servers.py), each answering as
that server does on the wire, and against addresses that are wrong in the usual ways."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
from openai_servers import PORTAL, FakeServer

from app import remote_engine
from app.remote_engine import RemoteEngine, RemoteError, RemoteTarget, _stats, list_models
from app.remote_wire import DEFAULT_URL, base_url
from engine.session import GenerationParams

USER = [{"role": "user", "content": "Hello"}]
PARAMS = GenerationParams(max_new_tokens=64)
WHERE = "Connect to a server"


def reply(engine: RemoteEngine, thinking: bool | None = None, cancel=None) -> tuple:
    """(text, finish_reason, stats) of one reply."""
    events = list(engine.generate(engine.chat_ids(USER, thinking), PARAMS, cancel))
    assert events[-1].finished
    return "".join(e.text for e in events), events[-1].finish_reason, events[-1].stats


@pytest.mark.parametrize("flavour", ["ollama", "llamacpp", "vllm", "lmstudio"])
def test_each_server_streams_its_thinking_its_answer_and_its_usage(flavour):
    """Each server's thinking field comes back in <think>, as a local model writes it; the
    usage each sends only when asked (Ollama) is asked for; the address as people type it
    (no scheme, no /v1) reaches the API. The Thinking switch turns each one's thinking off:
    Ollama's as reasoning_effort "none", which no other server is sent (vLLM may refuse it)."""
    with FakeServer(flavour, models=["qwen3:8b"]) as server:
        address = server.root.removeprefix("http://")  # 127.0.0.1:PORT, as typed
        engine = RemoteEngine(RemoteTarget(address))
        assert engine.model == "qwen3:8b" and engine.url == server.url
        assert engine.client.timeout.connect <= 10  # a dead host fails fast, not in 600 s
        text, reason, stats = reply(engine, thinking=True)
        assert text == "<think>\nLet me think. \n</think>\n\nHello there! "
        assert reason == "stop"
        assert (stats.prompt_tokens, stats.new_tokens) == (12, 5)
        body = server.chats()[-1]
        assert body["stream"] and body["stream_options"] == {"include_usage": True}
        assert body["chat_template_kwargs"] == {"enable_thinking": True}
        assert "reasoning_effort" not in body  # thinking on: no level is forced on Ollama
        assert engine.ollama == (flavour == "ollama") and not engine.takes_thinking_budget
        list(engine.generate(engine.chat_ids(USER, True), PARAMS, thinking_budget=64))
        assert "thinking_budget" not in server.chats()[-1]  # a field of Snug's alone
        text, _, _ = reply(engine, thinking=False)
        assert text == "Hello there! "
        body = server.chats()[-1]
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        if flavour == "ollama":  # it reads no chat_template_kwargs
            assert body["reasoning_effort"] == "none"
        else:
            assert "reasoning_effort" not in body
        # vLLM says the context it runs the model with; the others do not.
        assert engine.served_context == (32768 if flavour == "vllm" else None)
        engine.unload()


def test_ollama_is_sent_no_effort_where_the_switch_is_not_set():
    """A model without the switch (or thinking on) is left to think as Ollama has it think;
    whether the server is Ollama is asked at its /api/version."""
    with FakeServer("ollama") as server:
        engine = RemoteEngine(RemoteTarget(server.url))
        assert reply(engine)[0] == "<think>\nLet me think. \n</think>\n\nHello there! "
        assert "reasoning_effort" not in server.chats()[-1]
        assert ("GET", "/api/version") in [(m, p) for m, p, _, _ in server.requests]


@pytest.mark.parametrize(
    "version",
    [None, PORTAL, {"version": 12}, {"version": "0.12.11", "snug_version": "0.4.0"}],
    ids=["no-route", "web-page", "no-string", "snug-serve"],
)
def test_a_server_that_does_not_answer_as_ollama_is_not_taken_for_it(version):
    """Only {"version": "0.x.y"} at /api/version makes a server Ollama. No such route (a
    404), a proxy's login page there, a version that is no string, or snug serve's answer
    (its OpenAI API reads chat_template_kwargs): the request stays as it was, and the chat
    works all the same."""
    with FakeServer("ollama") as server:
        server.version = version
        engine = RemoteEngine(RemoteTarget(server.url))
        assert not engine.ollama
        text, reason, _ = reply(engine, thinking=False)
        assert reason == "stop" and text.endswith("Hello there! ")
        assert "reasoning_effort" not in server.chats()[-1]


def test_a_server_slow_to_say_whether_it_is_ollama_is_not_waited_for(monkeypatch):
    monkeypatch.setattr(remote_engine, "PROBE_S", 0.3)
    with FakeServer("ollama") as server:
        server.stall_s = 5.0  # /api/version answers that late
        start = time.monotonic()
        engine = RemoteEngine(RemoteTarget(server.url))
        assert time.monotonic() - start < 2.0 and not engine.ollama
        server.stall_s = 0.0
        assert reply(engine, thinking=False)[1] == "stop"


def test_the_ollama_stand_in_reads_the_effort_as_ollama_does():
    """As Ollama's openai.go: `reasoning.effort` before `reasoning_effort`; "none" turns the
    thinking off; any value but high, medium, low or none is a 400 that names them."""

    def ask(server: FakeServer, **fields) -> httpx.Response:
        body = {"model": "model-a", "messages": USER, "stream": True, **fields}
        return httpx.post(server.url + "/chat/completions", json=body, timeout=10)

    with FakeServer("ollama") as server:
        assert '"reasoning"' in ask(server, reasoning_effort="high").text
        assert '"reasoning"' not in ask(server, reasoning_effort="none").text
        both = ask(server, reasoning={"effort": "none"}, reasoning_effort="high")
        assert '"reasoning"' not in both.text
        refused = ask(server, reasoning_effort="max")
        assert refused.status_code == 400
        message = 'invalid reasoning value: \'max\' (must be "high", "medium", "low", or "none")'
        assert refused.json()["error"] == {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }


def test_addresses_as_people_type_them():
    assert base_url("localhost:11434") == "http://localhost:11434/v1"
    assert base_url("http://localhost:11434/") == "http://localhost:11434/v1"
    assert base_url(" http://10.0.0.5:8080/v1/ ") == "http://10.0.0.5:8080/v1"
    assert base_url("http://h:1234/v1/chat/completions") == "http://h:1234/v1"
    assert base_url("https://h/v1/models") == "https://h/v1"
    assert base_url("http://h:3000/api") == "http://h:3000/api"  # a path of its own stays
    assert base_url("") == DEFAULT_URL


def test_an_address_without_v1_is_completed_and_a_wrong_path_is_said():
    """Ollama answers a route it lacks with a plain-text 404; vLLM with {"detail"}; LM
    Studio with a 200 {"error"}: each comes back as a sentence naming the Server URL."""
    with FakeServer("ollama", models=["llama3.2:latest"]) as server:
        assert list_models(server.root) == [{"id": "llama3.2:latest", "context": None}]
        with pytest.raises(RemoteError, match="404 page not found") as error:
            list_models(server.root + "/api")
        assert "Server URL" in str(error.value) and "/v1" in str(error.value)
    with FakeServer("vllm") as server:
        with pytest.raises(RemoteError, match="answered 404.*Not Found.*Server URL"):
            list_models(server.root + "/v2")
    with FakeServer("lmstudio") as server:
        with pytest.raises(RemoteError, match="Unexpected endpoint.*Server URL"):
            list_models(server.root + "/api")


def test_ollama_without_models_says_to_pull_one():
    """Ollama lists no model as "data": null."""
    with FakeServer("ollama", models=[]) as server:
        assert list_models(server.url) == []
        with pytest.raises(RemoteError, match="lists no models.*ollama pull"):
            RemoteEngine(RemoteTarget(server.url))


def test_a_chat_model_is_picked_over_an_embedding_model():
    """LM Studio (and Ollama) list embedding models among the chat models."""
    models = ["text-embedding-nomic-embed-text-v1.5", "qwen/qwen3-4b"]
    with FakeServer("lmstudio", models=models) as server:
        engine = RemoteEngine(RemoteTarget(server.url))
        assert engine.model == "qwen/qwen3-4b"
        assert reply(engine)[0].endswith("Hello there! ")


@pytest.mark.parametrize("flavour", ["ollama", "vllm", "lmstudio"])
def test_an_unknown_model_is_named_with_what_to_do(flavour):
    with FakeServer(flavour, models=["qwen3:8b"]) as server:
        engine = RemoteEngine(RemoteTarget(server.url, model="qwen3:80b"))
        with pytest.raises(RemoteError) as error:
            reply(engine)
        message = str(error.value)
        assert "answered 404" in message and "qwen3:80b" in message
        assert "List models" in message and WHERE in message


def test_keys_and_a_server_still_loading_are_said_by_name():
    with FakeServer("llamacpp", key="sesame") as server:
        engine = RemoteEngine(RemoteTarget(server.url, "wrong"))  # its /models needs no key
        with pytest.raises(RemoteError, match="answered 401.*Invalid API Key") as error:
            reply(engine)
        assert "API key" in str(error.value) and WHERE in str(error.value)
        with pytest.raises(RemoteError, match="enter a key under API key"):
            reply(RemoteEngine(RemoteTarget(server.url)))
        assert reply(RemoteEngine(RemoteTarget(server.url, "sesame")))[1] == "stop"
        server.loading = True
        with pytest.raises(RemoteError, match="answered 503.*Loading model.*try again"):
            list_models(server.url)
    with FakeServer("vllm", key="sesame") as server:
        with pytest.raises(RemoteError, match="answered 401.*Unauthorized.*API key"):
            list_models(server.url, "wrong")


def test_a_reply_longer_than_the_servers_context_names_the_setting():
    """vLLM refuses max_tokens past its --max-model-len (the app asks for 2048 by default)."""
    with FakeServer("vllm", models=["Qwen/Qwen3-8B"]) as server:
        server.context = 2048
        engine = RemoteEngine(RemoteTarget(server.url))
        assert engine.served_context == 2048
        long = GenerationParams(max_new_tokens=2048)
        with pytest.raises(RemoteError, match="maximum context length is 2048") as error:
            list(engine.generate(engine.chat_ids(USER), long))
        assert "Max new tokens (Settings > Sampling)" in str(error.value)


def test_a_password_in_the_address_is_never_said():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(RemoteError) as error:
        list_models(f"http://me:hunter2@127.0.0.1:{port}/v1")
    assert "hunter2" not in str(error.value) and f"me:***@127.0.0.1:{port}" in str(error.value)


def test_a_wrong_port_names_the_setting():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(RemoteError, match="cannot reach") as error:
        list_models(f"http://127.0.0.1:{port}/v1")
    assert "Server URL" in str(error.value) and f":{port}/v1" in str(error.value)


def test_a_login_page_instead_of_the_api_is_said():
    """A captive portal or a proxy answers with a web page: at connect, and where it comes
    between the app and a server it had reached (the Wi-Fi's session ran out)."""
    with FakeServer("portal") as server:
        with pytest.raises(RemoteError, match="web page.*Hotel Wi-Fi: sign in.*Server URL"):
            list_models(server.url)
    with FakeServer("ollama") as server:
        engine = RemoteEngine(RemoteTarget(server.url))
        server.flavour = "portal"
        with pytest.raises(RemoteError, match="web page.*Server URL"):
            reply(engine)


def test_a_server_that_stops_mid_reply_is_not_taken_for_a_whole_reply():
    with FakeServer("llamacpp") as server:
        engine = RemoteEngine(RemoteTarget(server.url))
        server.cut_after = 3  # the connection drops
        with pytest.raises(RemoteError, match="broke off.*text so far is kept"):
            reply(engine)
        server.cut_after, server.end_early_after = None, 3  # a clean end, but too soon
        with pytest.raises(RemoteError, match="ended the reply before it was finished"):
            reply(engine)
        server.end_early_after, server.fail_after = None, 3  # llama.cpp's `error:` line
        with pytest.raises(RemoteError, match="stopped the reply: the KV cache is full"):
            reply(engine)


def test_stop_ends_a_reply_at_once_while_the_server_says_nothing():
    """Stop does not wait for the server's next word: before its answer begins (a long
    prompt, a model loading) and between two words; the connection is closed, which is how
    the servers learn to stop."""
    with FakeServer("ollama") as server:
        engine = RemoteEngine(RemoteTarget(server.url))
        server.stall_s = 5.0
        for pause_after in (None, 2):
            server.pause_after = pause_after
            cancel = threading.Event()
            threading.Timer(0.3, cancel.set).start()
            start = time.monotonic()
            text, reason, _ = reply(engine, cancel=cancel)
            assert time.monotonic() - start < 2.0 and reason == "cancelled"
        assert text == "<think>\nLet me \n</think>"  # the words before the pause
        assert server.hung_up.wait(2.0)


def test_stats_come_from_llama_cpp_timings_where_no_usage_is_sent():
    stats = _stats(None, 0.0, 0.5, {"prompt_n": 40, "predicted_n": 9, "draft_n": 4})
    assert (stats.prompt_tokens, stats.new_tokens, stats.drafted) == (40, 9, 4)
    assert _stats(None, 0.0, 0.5, {}) is None
    # tokens but no text (all of it stopped or filtered): no rate made up from nothing
    silent = _stats({"prompt_tokens": 5, "completion_tokens": 8}, time.perf_counter(), None)
    assert silent.new_tokens == 8 and silent.decode_tok_s == 0.0


def test_stop_before_the_answer_begins_hangs_up_at_once():
    """A long prompt or a model still loading: the server has not answered yet when Stop
    comes, and is told at once (the connection closes), each time, so that its slot is free
    for the next message rather than busy with a reply nobody waits for."""
    with FakeServer("ollama") as server:
        engine = RemoteEngine(RemoteTarget(server.url))
        server.stall_s = 5.0
        for _ in range(2):
            server.hung_up.clear()
            cancel = threading.Event()
            threading.Timer(0.2, cancel.set).start()
            assert reply(engine, cancel=cancel)[1] == "cancelled"
            assert server.hung_up.wait(1.0)
        server.stall_s = 0.0
        assert reply(engine)[1] == "stop"  # and the next message is answered


@pytest.mark.parametrize("key", ["sesame\nsesame", "sésame", "sesame\u200b"])
def test_an_api_key_no_header_can_carry_is_said_as_the_keys_fault(key):
    """A key pasted with a line break, a letter from outside ASCII or an invisible space
    copied from a web page is not taken for a server that cannot be reached."""
    with FakeServer("vllm", key="sesame") as server:
        with pytest.raises(RemoteError, match="API key holds a character") as error:
            list_models(server.url, key)
        assert "cannot reach" not in str(error.value) and WHERE in str(error.value)
        assert list_models(server.url, " Bearer sesame ")  # as pasted from a curl line


@pytest.mark.parametrize(
    ("status", "what"), [(500, "failed on its side"), (502, "a proxy"), (504, "a proxy")]
)
def test_a_server_or_proxy_failing_says_what_to_do(status, what):
    """llama.cpp's 500 (out of memory, a crash), nginx's 502 or 504 page before a server
    that is down or stuck: each says where the fault is and what to try."""
    with FakeServer("llamacpp") as server:
        engine = RemoteEngine(RemoteTarget(server.url))
        server.chat_status = status
        with pytest.raises(RemoteError, match=f"answered {status}") as error:
            reply(engine)
        assert what in str(error.value) and "Regenerate" in str(error.value)
