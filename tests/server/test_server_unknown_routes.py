"""A route the server does not have answers 404 in its API's shape, pointing at the list
of models in that API: Ollama's `/api/...` routes at `GET /api/tags`, the others at
`GET /v1/models`; a stored chat completion's, saying that none is kept."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import KEY

HEADERS = {"Authorization": f"Bearer {KEY}"}


def test_an_unknown_ollama_route_points_at_api_tags(scripted):
    r = httpx.post(scripted.base + "/api/unknown", json={}, headers=HEADERS)
    assert r.status_code == 404
    message = r.json()["error"]  # Ollama's shape: the message alone
    assert "POST /api/unknown" in message and "GET /api/tags" in message
    assert "/v1/models" not in message


def test_an_unknown_openai_route_points_at_v1_models(scripted):
    r = httpx.get(scripted.url + "/unknown", headers=HEADERS)
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "not_found" and "GET /v1/models" in error["message"]


def test_a_stored_chat_completion_is_not_kept_and_says_so(scripted):
    """The `openai` client's stored-completion calls (`chat.completions.retrieve`,
    `.update`, `.delete`, `.messages.list`) serve OpenAI's distillation and evals products:
    nothing is kept here, and the 404 says what to use instead."""
    client = scripted.client()
    for call in (
        lambda: client.chat.completions.retrieve("chatcmpl-1"),
        lambda: client.chat.completions.delete("chatcmpl-1"),
        lambda: client.chat.completions.messages.list("chatcmpl-1"),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            call()
        message = info.value.body["message"]
        assert "not kept" in message and "/v1/responses" in message
