"""Browsers may call the server from pages on this machine (CORS), not from any site the
user visits, unless the server names it; and a body past the limit is refused by name."""

from __future__ import annotations

import httpx
import pytest

from engine.server.app import create_app
from engine.server.runner import ServerThread
from tests.server.conftest import KEY


def preflight(base: str, origin: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    return httpx.options(base + "/v1/chat/completions", headers=headers)


@pytest.mark.parametrize(
    "origin",
    ["http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:5173", "app://obsidian.md"],
)
def test_pages_on_this_machine_may_call_it(served, origin):
    r = preflight(served.base, origin)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    models = httpx.get(
        served.url + "/models", headers={"Origin": origin, "Authorization": f"Bearer {KEY}"}
    )
    assert models.status_code == 200 and models.headers["access-control-allow-origin"] == origin


def test_other_sites_may_not_unless_named(served):
    for origin in ("https://evil.example", "http://localhost.evil.example", "null"):
        r = preflight(served.base, origin)
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    named = ServerThread(
        create_app(served.scheduler, api_key=KEY, cors_origins=["https://chat.example.org"])
    ).start()
    try:
        ok = preflight(named.url[: -len("/v1")], "https://chat.example.org")
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://chat.example.org"
        assert preflight(named.url[: -len("/v1")], "https://evil.example").status_code == 400
    finally:
        named.stop()


def test_a_body_past_the_limit_names_the_setting(served):
    small = ServerThread(create_app(served.scheduler, api_key=KEY, max_body=1000)).start()
    try:
        body = {"model": served.model, "messages": [{"role": "user", "content": "x" * 2000}]}
        r = httpx.post(
            small.url[: -len("/v1")] + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 413 and "--max-body-mib" in r.json()["error"]["message"]
    finally:
        small.stop()
