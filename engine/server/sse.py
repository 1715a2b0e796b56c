"""Server-sent events: a streamed reply's response, its events each a `data:` line (and
an `event:` line where the API names them)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Protocol

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class Cancellable(Protocol):
    """What a stream answers: a reply (`Generation`), or a request's replies (`Choices`)."""

    def cancel(self) -> None: ...


def sse(events: AsyncIterator[str], gen: Cancellable) -> StreamingResponse:
    # The background task runs however the response ends (a client gone before the first
    # chunk included), so no request outlives its response.
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        background=BackgroundTask(gen.cancel),
    )
