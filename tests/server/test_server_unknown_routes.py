"""A route the server does not have answers 404 in its API's shape, pointing at the list
of models in that API: Ollama's `/api/...` routes at `GET /api/tags`, the others at
`GET /v1/models`."""

from __future__ import annotations

import httpx

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
