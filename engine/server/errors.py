"""Errors as each API answers them, whatever raised them: OpenAI's `{"error": {message, type,
param, code}}`, Anthropic's `{"type": "error", "error": {type, message}}` on its Messages
routes (and to clients that send `anthropic-version`), Ollama's `{"error": message}` on
/api routes. A 503 (queue full, shutting down; 529 in Anthropic's shape, as its API
answers) carries `Retry-After`; a 405 names the methods the route takes (`Allow`), and
OPTIONS on a route answers 204 with them.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine.server.messages import error_body as messages_body
from engine.server.messages import request_id
from engine.server.protocol import ApiError, error_of

# Routes of the APIs served here that this server does not have, said by name: a front-end
# shows the message where a bare 404 would leave its user guessing.
_NO_EMBEDDINGS = (
    "this server runs one chat model and no embedding model: point the embedding setting "
    "at a server that runs one"
)
MODELS_IN_APP = (
    "models are not added or removed over the API here: download them in Snug's Models tab "
    "(or with `hf download REPO`) and serve another with `snug serve --model`"
)
ABSENT = {
    "/v1/embeddings": _NO_EMBEDDINGS,
    "/embeddings": _NO_EMBEDDINGS,
    "/api/embed": _NO_EMBEDDINGS,
    "/api/embeddings": _NO_EMBEDDINGS,
    "/api/push": MODELS_IN_APP,
    "/api/create": MODELS_IN_APP,
    "/api/copy": MODELS_IN_APP,
    "/api/delete": MODELS_IN_APP,
}

# Stored chat completions (`store: true`; the `openai` client's `chat.completions.retrieve`,
# `.update`, `.delete`, `.messages.list`) feed OpenAI's distillation and evals products:
# nothing here reads them back, so none is kept.
_NOT_STORED = (
    "chat completions are not kept on this server, whatever 'store' says: keep the reply "
    "as it came, or use the Responses API (POST /v1/responses), whose responses are kept"
)
# llama.cpp's slot actions (`POST /slots/{id}?action=save|restore|erase`) work on a slot's
# own prompt cache; here the prompt cache is the server's, whatever stream ran a prompt.
_NO_SLOT_CACHE = (
    "a slot's prompt cache is not saved, restored or erased here: the server keeps each "
    "conversation's state in its own prompt cache, whichever slot ran it, and restores it "
    "when the conversation goes on"
)
ABSENT_UNDER = {
    "/v1/chat/completions/": _NOT_STORED,
    "/chat/completions/": _NOT_STORED,
    "/slots/": _NO_SLOT_CACHE,
}


def absent(path: str) -> str | None:
    """Why the server has no route at `path`, where it is one of an API it serves."""
    if path in ABSENT:
        return ABSENT[path]
    return next((why for head, why in ABSENT_UNDER.items() if path.startswith(head)), None)


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "the server is shutting down, so this reply was not finished; send the request again "
        "once the server is back",
        "server_overloaded",
        code="server_shutting_down",
    )


def shape_of(path: str, headers: Any = ()) -> str:
    """The API whose error shape a route answers in: "ollama", "anthropic" or "openai"
    (Anthropic's also where the client sends `anthropic-version`, as its clients do)."""
    if path == "/api" or path.startswith("/api/"):
        return "ollama"
    if path.rstrip("/") in ("/v1/messages", "/messages") or "/messages/" in path:
        return "anthropic"
    return "anthropic" if "anthropic-version" in headers else "openai"


def error_body(err: ApiError, shape: str) -> dict[str, Any]:
    if shape == "ollama":
        return {"error": err.message}
    if shape == "anthropic":
        return messages_body(err)
    return err.body()


def error_response(exc: Exception, shape: str = "openai", headers: dict | None = None) -> Response:
    """The error response for `exc` in `shape`'s form. Anthropic's carries the request's
    id (`request-id`, and `request_id` in the body), and its API answers an overloaded
    server (503 here) with 529, which its clients retry as such."""
    err = error_of(exc)
    headers = {**(headers or {}), **({"Retry-After": "1"} if err.status == 503 else {})}
    if shape != "anthropic":
        return JSONResponse(error_body(err, shape), status_code=err.status, headers=headers or None)
    rid = headers.setdefault("request-id", request_id())
    status = 529 if err.status == 503 else err.status
    return JSONResponse(messages_body(err, rid), status_code=status, headers=headers)


async def api_error(request: Request, exc: Exception) -> Response:
    return error_response(exc, shape_of(request.url.path, request.headers))


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (no such route, a method the route does not take)."""
    assert isinstance(exc, HTTPException)
    path = request.url.path.rstrip("/") or "/"
    if exc.status_code == 404:
        shape = shape_of(path, request.headers)
        models = "GET /api/tags" if shape == "ollama" else "GET /v1/models"  # its model list
        message = absent(path) or f"no route {request.method} {path}; see {models}"
        err = ApiError(404, message, code="not_found")
        return error_response(err, shape)
    if exc.status_code == 405:
        methods = (exc.headers or {}).get("Allow", "").split(",")
        allowed = ", ".join(sorted(m.strip() for m in methods if m.strip()))
        if request.method == "OPTIONS":  # what the route takes, as HTTP's OPTIONS asks
            return Response(status_code=204, headers={"Allow": f"{allowed}, OPTIONS"})
        message = f"{request.method} is not allowed on {path}; use {allowed}"
        err = ApiError(405, message, code="method_not_allowed")
        return error_response(err, shape_of(path, request.headers), {"Allow": allowed})
    err = ApiError(exc.status_code, str(exc.detail))
    return error_response(err, shape_of(path, request.headers), exc.headers)
