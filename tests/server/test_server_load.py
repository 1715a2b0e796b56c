"""Many clients against two admitted streams: all answered in order of the queue, a full
queue refused with 503, a client that goes away frees its slot."""

import threading
import time

import httpx
import openai
import pytest

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
