"""A request's JSON body, read with its limits: at most `max_body` bytes (413 past it, the
declared length checked before anything is read, a compressed body's inflated bytes counted
too), `Content-Encoding` gzip or deflate inflated (any other refused with 415, by name), and
a body that is not a JSON object refused with 400 saying what was sent. A client that hangs
up before its body is whole gets a 400 (which it will not read) rather than a server error.
A lone UTF-16 surrogate written as a JSON escape ("\\ud83d": JavaScript's JSON.stringify
writes one where a string was cut inside an emoji) is no character: it is read as U+FFFD,
as Go's JSON decoder (Ollama's) reads it, rather than failing wherever the text goes.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from starlette.requests import ClientDisconnect, Request

from engine.server.protocol import ApiError, bad

# zlib's window bits: 32 + 15 reads a gzip or a zlib stream (HTTP's deflate), its header
# saying which.
_INFLATE = {"gzip": 32 + 15, "x-gzip": 32 + 15, "deflate": 32 + 15}
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


async def read_json(request: Request, max_body: int) -> dict[str, Any]:
    """The JSON object of `request`'s body (ApiError where there is none)."""
    too_large = ApiError(
        413,
        f"the request body is larger than {max_body} bytes; send a shorter request "
        "(snug serve --max-body-mib raises the limit)",
        code="request_too_large",
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_body:
        raise too_large
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity", *_INFLATE):
        raise ApiError(
            415,
            f"the body's Content-Encoding '{encoding}' is not supported: send it uncompressed, "
            "or as gzip or deflate",
            code="unsupported_encoding",
        )
    inflate = zlib.decompressobj(_INFLATE[encoding]) if encoding in _INFLATE else None
    raw = bytearray()
    try:
        async for part in request.stream():
            if inflate is not None:
                try:
                    part = inflate.decompress(part, max_body + 1 - len(raw))
                except zlib.error as exc:
                    raise bad(
                        f"the body is not valid {encoding} ({exc}); send it uncompressed or "
                        "drop the Content-Encoding header",
                        code="invalid_encoding",
                    ) from exc
            raw += part
            if len(raw) > max_body or (inflate is not None and inflate.unconsumed_tail):
                raise too_large
    except ClientDisconnect as exc:
        raise bad(
            "the client closed the connection before the body was whole (shorter than its "
            "Content-Length)",
            code="incomplete_body",
        ) from exc
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        sent = request.headers.get("content-type", "")
        hint = f"; it was sent as {sent}" if sent and "json" not in sent else ""
        raise bad(
            f"the body is not valid JSON ({exc}){hint}; send a JSON object, as "
            "Content-Type: application/json",
            code="invalid_json",
        ) from exc
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", code="invalid_json")
    if not _SURROGATE_ESCAPE.search(raw):
        return body
    try:
        return _whole_characters(body)
    except RecursionError:
        raise bad("the body's JSON is nested too deeply", code="invalid_json") from None


def _whole_characters(value: Any) -> Any:
    """`value` with each lone surrogate in its strings (keys too) as U+FFFD (json.loads
    has joined the escaped pairs into their characters already)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_whole_characters(v) for v in value]
    if isinstance(value, dict):
        return {_whole_characters(k): _whole_characters(v) for k, v in value.items()}
    return value
