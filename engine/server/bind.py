"""The rule on where the server may listen: this machine only, unless an API key guards it.
Kept apart from uvicorn so that a caller checks it without importing the server."""

from __future__ import annotations

import ipaddress

from engine.errors import SnugError


class UnsafeBind(SnugError):
    """Listening beyond this machine without an API key."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to listen on an address other machines can reach without an API key."""
    if not is_loopback(host) and not api_key:
        raise UnsafeBind(
            f"--host {host} lets other machines reach the model; give a key with --api-key KEY "
            "(clients then send 'Authorization: Bearer KEY'), or keep the default 127.0.0.1"
        )
