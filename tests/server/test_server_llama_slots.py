"""llama.cpp's `GET /slots`: one object a stream (llama.cpp's slot), as its web UI and
monitoring tools read it: `id`, `n_ctx`, `speculative`, `is_processing`, and for a slot
at work its task (`id_task`), prompt counts, `params`, `next_token` (`n_decoded`,
`n_remain`), `prompt` and `generated` text; `?fail_on_no_slot=1` answers 503 while no slot
is idle."""

from __future__ import annotations

import contextlib
import json
import time

import httpx

from tests.server.conftest import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "The capital of France is"


def slots(served, **params) -> httpx.Response:
    return httpx.get(f"{served.base}/slots", params=params, headers=AUTH, timeout=30)


@contextlib.contextmanager
def busy(served, n_predict: int = 400):
    """A streamed completion that runs (past its first token) while the block runs."""
    body = {"prompt": PROMPT, "n_predict": n_predict, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", f"{served.base}/completion", json=body, headers=AUTH, timeout=60
    ) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["stop"] is False
        yield


def test_idle_slots_in_llama_cpps_shape(served):
    served.wait_idle()
    r = slots(served)
    assert r.status_code == 200, r.text
    got = r.json()
    assert [s["id"] for s in got] == list(range(served.engine.streams))
    for slot in got:
        assert slot["n_ctx"] == served.engine.context
        assert slot["is_processing"] is False and slot["speculative"] is False
    assert slots(served, fail_on_no_slot=1).status_code == 200


def test_a_slot_at_work_shows_its_task(served):
    served.wait_idle()
    with busy(served, n_predict=400):
        got = slots(served).json()
        working = [s for s in got if s["is_processing"]]
        assert len(working) == 1 and len(got) == served.engine.streams
        (slot,) = working
        (token,) = slot["next_token"]
        assert token["has_next_token"] is True and token["n_decoded"] >= 1
        assert token["n_decoded"] + token["n_remain"] == 400
        assert slot["params"]["n_predict"] == 400 and slot["params"]["ignore_eos"] is True
        assert slot["n_prompt_tokens"] == len(served.engine.tokenizer.encode(PROMPT))
        assert slot["prompt"] == PROMPT and isinstance(slot["generated"], str)
        assert isinstance(slot["id_task"], int)
        assert slots(served, fail_on_no_slot=1).status_code == 200  # the other is idle
    served.wait_idle()
    assert not any(s["is_processing"] for s in slots(served).json())


def test_no_idle_slot_fails_where_asked(served):
    served.wait_idle()
    with busy(served), busy(served):
        deadline = time.monotonic() + 10
        while sum(s["is_processing"] for s in slots(served).json()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        r = slots(served, fail_on_no_slot=1)
        assert r.status_code == 503 and "no slot available" in r.json()["error"]["message"]
        assert slots(served).status_code == 200
    served.wait_idle()


def test_slots_take_the_key(served):
    assert httpx.get(f"{served.base}/slots").status_code == 401


def test_a_completion_names_the_slot_it_ran_on(served):
    """`id_slot` in each event and in the reply: the slot (stream) that served it, as
    /slots lists them; with slot 0 at work, the next request runs on slot 1."""
    served.wait_idle()
    with busy(served):
        (taken,) = [s["id"] for s in slots(served).json() if s["is_processing"]]
        body = {"prompt": PROMPT, "n_predict": 4, "temperature": 0}
        whole = httpx.post(f"{served.base}/completion", json=body, headers=AUTH, timeout=60)
        assert whole.json()["id_slot"] == 1 - taken
        with httpx.stream(
            "POST", f"{served.base}/completion", json={**body, "stream": True}, headers=AUTH
        ) as r:
            events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
        assert {e["id_slot"] for e in events} == {1 - taken}
    served.wait_idle()


def test_slot_actions_are_refused_by_name(served):
    """llama.cpp's `POST /slots/{id}?action=save|restore|erase` works on a slot's own
    prompt cache; here the prompt cache is the server's, not a slot's: a 404 that says so."""
    r = httpx.post(f"{served.base}/slots/0", params={"action": "erase"}, headers=AUTH)
    assert r.status_code == 404 and "prompt cache" in r.json()["error"]["message"]
