"""Many clients against two admitted streams: all answered in order of the queue, a full
queue refused with 503 in each API's shape, a client that goes away frees its slot, a server
stopped mid-reply ends each reply with an error at once."""

import json
import threading
import time

import httpx
import openai
import pytest

from engine.scheduler import Scheduler
from tests.server.conftest import serve

KEY_HEADER = {"Authorization": "Bearer test-key"}
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
PROMPTS = [f"Question number {i}: what is {i} plus {i}?" for i in range(8)]


def test_eight_clients_two_streams_all_answered(served, solo):
    expected = [solo([{"role": "user", "content": p}], 8, thinking=False) for p in PROMPTS]
    served.scheduler.stats.peak_running = served.scheduler.stats.peak_waiting = 0
    results: dict[int, tuple[str, int]] = {}
    errors: list[Exception] = []

    def client_thread(i: int) -> None:
        try:
            stream = served.client().chat.completions.create(
                model=served.model,
                messages=[{"role": "user", "content": PROMPTS[i]}],
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=THINKING_OFF,
            )
            chunks = list(stream)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            results[i] = (text, chunks[-1].usage.completion_tokens)
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for i in range(8):
        assert results[i][0] == expected[i].lstrip("\n").rstrip()
        assert 1 <= results[i][1] <= 8
    stats = served.scheduler.stats
    assert stats.peak_running == 2 and stats.peak_waiting <= 6


def test_a_full_queue_is_refused_with_503_and_the_setting(served):
    """2 streams + 6 waiting: the ninth request is refused at once; the eight left are
    cancelled by closing their connections."""
    body = {
        "model": served.model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 900,  # no reply ends while the requests are sent, on a loaded machine
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=served.url, headers=KEY_HEADER, timeout=30) as http:
        opened = []
        try:
            for _ in range(8):
                response = http.send(
                    http.build_request("POST", "/chat/completions", json=body), stream=True
                )
                assert response.status_code == 200
                opened.append(response)
            refused = http.post("/chat/completions", json={**body, "stream": False})
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "queue_full" and error["type"] == "server_overloaded"
            assert "queue size 6" in error["message"] and "--queue" in error["message"]
            # Anthropic's and Ollama's routes: the same refusal in their shapes (Anthropic's
            # status for it is 529), Retry-After too
            user = [{"role": "user", "content": "Hi"}]
            for path, ask, shape in [
                ("/messages", {"messages": user, "max_tokens": 4}, "anthropic"),
                ("/api/chat", {"messages": user, "stream": False}, "ollama"),
                ("/api/generate", {"prompt": "Hi"}, "ollama"),
            ]:
                refused = http.post(served.base + path if "api" in path else path, json=ask)
                assert refused.status_code == (529 if shape == "anthropic" else 503)
                assert refused.headers["retry-after"] == "1"
                got = refused.json()
                if shape == "anthropic":
                    assert got["type"] == "error" and got["error"]["type"] == "overloaded_error"
                    assert "--queue" in got["error"]["message"]
                else:
                    assert set(got) == {"error"} and "--queue" in got["error"]
        finally:
            for response in opened:
                response.close()
    served.wait_idle()
    assert sorted(served.engine._free_slots) == [0, 1]
    client, streams = served.client(), []
    try:
        with pytest.raises(openai.APIStatusError) as info:
            for _ in range(9):  # the openai client sees the same refusal
                streams.append(
                    client.chat.completions.create(
                        model=served.model,
                        messages=[{"role": "user", "content": "Hi"}],
                        # Long enough that no reply ends (freeing a slot) while the nine
                        # requests are being sent on a loaded machine.
                        max_tokens=900,
                        stream=True,
                        extra_body={"ignore_eos": True},
                    )
                )
        assert info.value.status_code == 503 and len(streams) == 8
    finally:
        for stream in streams:
            stream.close()
    served.wait_idle()


def test_a_client_that_disconnects_frees_its_slot(served):
    client = served.client()
    finished = served.scheduler.stats.finished
    stream = client.chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=500,
        stream=True,
        extra_body={"ignore_eos": True, **THINKING_OFF},
    )
    for n, _chunk in enumerate(stream):
        if n == 3:
            break
    assert served.scheduler.running == 1
    t = time.monotonic()
    stream.close()
    served.wait_idle(5)
    freed_after = time.monotonic() - t
    assert served.scheduler.stats.finished == finished + 1
    assert sorted(served.engine._free_slots) == [0, 1]
    # 500 tokens take seconds here; the slot came back long before.
    assert freed_after < 1.0, freed_after


def test_a_client_that_gives_up_on_a_whole_reply_frees_its_slot(served):
    """Not streaming: the server looks for the client every 0.25 s while it generates."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 500}
    body["ignore_eos"] = True
    finished = served.scheduler.stats.finished
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{served.url}/chat/completions", json=body, headers=KEY_HEADER, timeout=0.5)
    t = time.monotonic()
    # On a loaded machine the request may reach the scheduler only after the client left.
    while served.scheduler.stats.finished == finished:
        assert time.monotonic() - t < 5, "the abandoned request never ended"
        time.sleep(0.01)
    served.wait_idle(5)
    assert time.monotonic() - t < 1.0
    assert sorted(served.engine._free_slots) == [0, 1]


class Gated(Scheduler):
    """Holds every decode step once a request has two tokens, until `gate` opens: replies
    stay in flight for as long as a test needs."""

    def __init__(self, engine, **kwargs) -> None:
        super().__init__(engine, **kwargs)
        self.gate = threading.Event()
        self.held = threading.Event()

    def _next_tokens(self, batch):
        if any(len(r.generated) >= 2 for r in batch):
            self.held.set()
            self.gate.wait(30)
        return super()._next_tokens(batch)


def test_a_server_stopped_mid_reply_ends_each_reply_in_its_apis_shape(light_checkpoint):
    """Three streams and a whole reply, decoding or waiting for a slot: stopping the server
    ends each at once (not after uvicorn's 3 s grace) with a 503 in its API's shape, each
    stream whole to its terminator; the slots come back."""
    s = serve(light_checkpoint, Gated, streams=2, queue=2)
    user = [{"role": "user", "content": "Hi"}]
    asks = {
        "openai": ("/v1/chat/completions", {"messages": user, "max_tokens": 50, "stream": True}),
        "anthropic": ("/v1/messages", {"messages": user, "max_tokens": 50, "stream": True}),
        "ollama": ("/api/chat", {"messages": user, "options": {"num_predict": 50}}),
        "whole": ("/v1/completions", {"prompt": "Hi", "max_tokens": 50}),
    }
    got: dict[str, tuple[int, dict, str]] = {}

    def client(name: str) -> None:
        path, body = asks[name]
        body = {**body, "ignore_eos": True}
        try:
            with httpx.stream("POST", s.base + path, json=body, headers=KEY_HEADER) as r:
                got[name] = (r.status_code, dict(r.headers), r.read().decode())
        except httpx.HTTPError as exc:  # reported by the asserts below
            got[name] = (0, {}, repr(exc))

    threads = {name: threading.Thread(target=client, args=(name,)) for name in asks}
    try:
        for thread in threads.values():
            thread.start()
        assert s.scheduler.held.wait(30)
        deadline = time.monotonic() + 30
        while s.scheduler.running + s.scheduler.waiting < 4:
            assert time.monotonic() < deadline, "the requests did not reach the scheduler"
            time.sleep(0.01)
        t = time.monotonic()
        s.server.stop()
        stopped_after = time.monotonic() - t
        for thread in threads.values():
            thread.join(30)
        assert stopped_after < 2.0, stopped_after
        status, _, text = got["openai"]
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "server_shutting_down" and "shutting down" in error["message"]
        status, _, text = got["anthropic"]
        assert status == 200 and text.rstrip().splitlines()[-2] == "event: error", text
        error = json.loads(text.rstrip().splitlines()[-1][6:])["error"]
        assert error["type"] == "overloaded_error" and "shutting down" in error["message"]
        status, _, text = got["ollama"]
        assert status == 200 and "shutting down" in json.loads(text.splitlines()[-1])["error"]
        status, headers, text = got["whole"]
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(text)["error"]["code"] == "server_shutting_down"
    finally:
        s.scheduler.gate.set()
        s.server.stop()
        s.wait_idle()
        assert sorted(s.engine._free_slots) == [0, 1]
        s.scheduler.close()
