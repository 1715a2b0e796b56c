"""Sampling a request leaves out: the values Qwen3.5's model cards recommend for the reply's
mode (engine.sampling.RECOMMENDED: temperature 1.0 and top-p 0.95 where the reply thinks
first, 0.7 and 0.8 where it does not, top-k 20), as the app and the command line take
them; the presence penalty stays off unless asked, as in OpenAI's API."""

from __future__ import annotations

import pytest

from engine.scheduler import Scheduler
from tests.server.conftest import serve

USER = [{"role": "user", "content": "Hi"}]


class Recording(Scheduler):
    """Keeps each submitted request's parameters."""

    def __init__(self, engine, **kwargs) -> None:
        super().__init__(engine, **kwargs)
        self.seen: list = []

    def submit(self, prompt_ids, params=None, *args, **kwargs):
        self.seen.append(params)
        return super().submit(prompt_ids, params, *args, **kwargs)


@pytest.fixture(scope="module")
def recorded(tools_checkpoint):
    s = serve(tools_checkpoint, Recording)
    yield s
    s.server.stop()
    s.scheduler.close()


def knobs(params) -> tuple:
    return (params.temperature, params.top_p, params.top_k, params.min_p, params.presence_penalty)


@pytest.mark.parametrize(
    "thinking, sent, expected",
    [
        (True, {}, (1.0, 0.95, 20, 0.0, 0.0)),
        (False, {}, (0.7, 0.8, 20, 0.0, 0.0)),
        (True, {"temperature": 0.2, "presence_penalty": 1.0}, (0.2, 0.95, 20, 0.0, 1.0)),
        (False, {"top_p": 0.5, "extra_body": {"top_k": 5}}, (0.7, 0.5, 5, 0.0, 0.0)),
    ],
)
def test_a_requests_unset_sampling_follows_the_replys_mode(recorded, thinking, sent, expected):
    extra = {"chat_template_kwargs": {"enable_thinking": thinking}}
    extra |= sent.pop("extra_body", {})
    recorded.client().chat.completions.create(
        model=recorded.model, messages=USER, max_tokens=2, extra_body=extra, **sent
    )
    assert knobs(recorded.scheduler.seen[-1]) == expected


def test_a_completion_that_opens_a_thinking_block_samples_as_one(recorded):
    client = recorded.client()
    client.completions.create(model=recorded.model, prompt="<think>\n", max_tokens=2)
    assert knobs(recorded.scheduler.seen[-1]) == (1.0, 0.95, 20, 0.0, 0.0)
    client.completions.create(model=recorded.model, prompt="Once upon", max_tokens=2)
    assert knobs(recorded.scheduler.seen[-1]) == (0.7, 0.8, 20, 0.0, 0.0)
