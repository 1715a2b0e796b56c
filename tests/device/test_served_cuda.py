"""The HTTP server on the GPU under a 4 GiB memory limit (as `SNUG_MEMORY_LIMIT_GIB=4 snug
serve` runs it): the OpenAI-compatible route with the sampling settings the host applies
(`frequency_penalty`, `logit_bias`) beside ones drawn on the device, streamed and whole."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engine.config import EngineSettings
from engine.scheduler import Scheduler
from engine.server.app import create_app
from engine.server.runner import ServerThread
from engine.session import Engine

KEY = "device-key"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    path = write_checkpoint(tmp_path_factory.mktemp("served") / "tiny", "tiny", "mlx4", seed=5)
    write_tokenizer(path)
    # Batch-invariant decode, as `snug serve` runs more than one stream: a reply does not
    # depend on the others in its steps (a greedy reply of `n` equals a request of one).
    settings = EngineSettings(backend="cuda", batch_invariant=True).with_gib(limit=4)
    engine = Engine.load(path, settings, context=1024, streams=2, max_rows=128)
    scheduler = Scheduler(engine, queue_size=4).start()
    server = ServerThread(create_app(scheduler, api_key=KEY)).start()
    yield engine, server.url
    server.stop()
    scheduler.close()
    engine.unload()


def chat(url: str, stream: bool = False, **body) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Say something."}], **body}
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(f"{url}/chat/completions", json={**body, "stream": stream},
                      headers=headers, timeout=120)  # fmt: skip


def streamed_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    parts = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                parts.append(choice["delta"].get("content") or "")
    return "".join(parts)


def test_a_logit_bias_is_every_pick_of_a_served_reply(served):
    engine, url = served
    letter = engine.tokenizer.encode("a")[0]
    body = {"max_tokens": 6, "temperature": 0, "logit_bias": {str(letter): 100}}
    reply = chat(url, **body)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["usage"]["completion_tokens"] == 6
    text = out["choices"][0]["message"]["content"]
    assert text == engine.tokenizer.decode([letter] * 6)
    assert streamed_text(chat(url, stream=True, **body)) == text


def test_a_frequency_penalty_reply_streams_as_it_answers_whole(served):
    _, url = served
    body = {"max_tokens": 24, "temperature": 0, "frequency_penalty": 2.0}
    whole = chat(url, **body)
    assert whole.status_code == 200, whole.text
    text = whole.json()["choices"][0]["message"]["content"]
    assert streamed_text(chat(url, stream=True, **body)) == text


def test_host_and_device_picks_are_served_side_by_side(served):
    """A request picked on the host and one drawn on the device, sent together: one batch
    of two streams, both answered in full."""
    _, url = served
    bodies = [
        {"max_tokens": 24, "temperature": 0.7, "frequency_penalty": 1.0, "seed": 1},
        {"max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "seed": 2},
    ]
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda b: chat(url, ignore_eos=True, **b), bodies))
    for reply in replies:
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 24


def test_a_thinking_budget_is_held_on_the_gpu(served):
    """`thinking_budget` served on CUDA under 4 GiB: the reply's thinking ends with the
    closing words after the budget, whole and streamed alike; the answer follows."""
    body = {"chat_template_kwargs": {"enable_thinking": True}, "thinking_budget": 6}
    body |= {"max_tokens": 120, "temperature": 0}
    whole = chat(served[1], **body)
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    if "Considering the limited time" not in message["reasoning_content"]:
        pytest.skip("the model closed its thinking within the budget")
    assert whole.json()["usage"]["completion_tokens"] == 120
    assert streamed_text(chat(served[1], stream=True, **body)) == (message["content"] or "")


def test_n_replies_share_the_batch_on_the_gpu(served):
    """`n` = 4 on two streams and a queue: four replies, each drawn apart and written in
    full, whole and streamed; greedy, every reply is the reply a request of one gets."""
    _, url = served
    body = {"max_tokens": 16, "temperature": 0.8, "seed": 3, "ignore_eos": True, "n": 4}
    whole = chat(url, **body)
    assert whole.status_code == 200, whole.text
    out = whole.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["usage"]["completion_tokens"] == 64
    texts = [c["message"]["content"] for c in out["choices"]]
    assert len(set(texts)) > 1, texts
    streamed = chat(url, stream=True, **body)
    assert streamed.status_code == 200, streamed.text
    parts = ["", "", "", ""]
    for line in streamed.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                parts[choice["index"]] += choice["delta"].get("content") or ""
    assert all(parts), parts
    greedy = {"max_tokens": 16, "temperature": 0}
    one = chat(url, **greedy).json()["choices"][0]["message"]["content"]
    three = chat(url, n=3, **greedy).json()["choices"]
    assert [c["message"]["content"] for c in three] == [one] * 3
