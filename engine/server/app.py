"""The ASGI app: OpenAI's chat completions, completions and models, over one Scheduler.

    GET  /health                 liveness, streams running and waiting (no key needed)
    GET  /v1/models              the one loaded model (Anthropic's shape with anthropic-version)
    POST /v1/chat/completions    chat template (tools included), thinking apart, tool calls
    POST /v1/completions         a prompt string or token ids, as is
    POST /v1/responses           the Responses API (GET, DELETE /v1/responses/{id}: kept ones)
    POST /v1/messages            Anthropic's Messages API (and /v1/messages/count_tokens)

Every error is answered in its API's shape (errors.py) with its status: 400 bad request,
401 bad key, 404 unknown model or route, 405 wrong method, 413 body too large, 415 unknown
Content-Encoding, 503 queue full or shutting down. A refused or malformed request never
reaches the engine, so it cannot disturb other streams. When the server stops, each reply
still under way ends with a 503 error in its API's shape (`OpenAIServer.shutdown`).
"""

from __future__ import annotations

import hmac
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from engine.checkpoint.checkpoint import model_name
from engine.context_fit import fit_prompt
from engine.errors import SnugError, TemplateError
from engine.scheduler import QueueFull, Scheduler
from engine.server.body import read_json
from engine.server.errors import api_error, http_error, shutting_down
from engine.server.generation import Generation
from engine.server.legacy import as_function_call, finish, read_legacy
from engine.server.llama_api import LlamaApi
from engine.server.logprobs import LogprobFormat
from engine.server.messages_api import MessagesApi, model_info, model_list, wants_anthropic
from engine.server.ollama import OllamaApi
from engine.server.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    Options,
    bad,
    read_chat,
    read_completion,
    streamed_error,
    tool_schemas,
)
from engine.server.reply import ReplySplitter, prompt_opens_thinking
from engine.server.response_store import ResponsesApi
from engine.server.sse import data, sse
from engine.server.tokenize_api import TokenizeApi

MAX_BODY = 32 << 20  # bytes of one request body (files sent in a request: base64 PDFs)
# Web pages that may call the server from a browser (CORS), as Ollama allows by default:
# those served from this machine, and desktop shells' own pages. Any other site the user
# visits could otherwise spend the model (and read what it says): `--cors-origin` adds one.
LOCAL_ORIGINS = r"(https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?|(app|tauri)://[^/]*)"


def create_app(
    scheduler: Scheduler,
    model_id: str | None = None,
    api_key: str | None = None,
    max_body: int = MAX_BODY,
    cors_origins: Sequence[str] = (),
    thinking_budget: int = 0,
) -> Starlette:
    """The server's ASGI app over a started `scheduler` (its engine's model, by its folder's
    name, or its repository's for a Hugging Face cache snapshot, unless `model_id` is given).
    With `api_key`, /v1 routes need `Bearer KEY`. Browsers may call it from pages on this
    machine (LOCAL_ORIGINS) and from `cors_origins` ("*": any). `thinking_budget`: the
    most tokens a reply thinks where its request names no budget (0: no limit)."""
    server = OpenAIServer(scheduler, model_id, api_key, max_body, cors_origins)
    server.thinking_budget = thinking_budget
    return server.app


class OpenAIServer:
    def __init__(
        self,
        scheduler: Scheduler,
        model_id: str | None,
        api_key: str | None,
        max_body: int,
        cors_origins: Sequence[str] = (),
    ) -> None:
        self.scheduler = scheduler
        self.engine = scheduler.engine
        self.tokenizer = self.engine.tokenizer
        self.model_id = model_id or model_name(self.engine.model_dir)
        self.api_key = api_key
        self.max_body = max_body
        self.created = int(time.time())
        self.thinking_budget = 0  # where a request names none (create_app's)
        self.live: weakref.WeakSet[Generation] = weakref.WeakSet()  # replies under way
        self.closing = False
        api = [
            ("/models", self.models, "GET"),
            ("/models/{model:path}", self.model, "GET"),
            ("/chat/completions", self.chat, "POST"),
            ("/completions", self.completions, "POST"),
            *ResponsesApi(self).routes(),
            *MessagesApi(self).routes(),
            *TokenizeApi(self).routes(),
        ]
        routes = [
            Route("/health", self.health, methods=["GET"]),
            *(Route("/v1" + path, call, methods=[method]) for path, call, method in api),
            # The same without /v1, as llama.cpp's server answers them too: clients given
            # the bare address (http://127.0.0.1:8080) append the route to it.
            *(Route(path, call, methods=[method]) for path, call, method in api),
            *OllamaApi(self).routes(),
            *(
                Route(path, call, methods=[method])
                for path, call, method in LlamaApi(self).routes()
            ),
        ]
        handlers = {
            ApiError: api_error,
            HTTPException: http_error,
            SnugError: api_error,
            Exception: api_error,  # a bug: still answered in the API's shape (500)
        }
        cors = Middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_origin_regex=LOCAL_ORIGINS,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["*"],
        )
        self.app = Starlette(
            routes=routes,
            exception_handlers=handlers,  # type: ignore[arg-type]
            middleware=[cors],
        )
        self.app.state.server = self

    def shutdown(self) -> None:
        """The server is stopping (on its event loop, before uvicorn waits for connections
        to close): every reply under way ends with a 503 in its API's shape, after the
        tokens it already has, its request cancelled; requests that arrive now are refused
        the same way."""
        self.closing = True
        for gen in list(self.live):
            gen.abort(shutting_down())

    # ----- routes ---------------------------------------------------------------------------
    async def health(self, request: Request) -> JSONResponse:
        s = self.scheduler
        return JSONResponse(
            {
                "status": "ok",
                "model": self.model_id,
                "running": s.running,
                "waiting": s.waiting,
                "streams": self.engine.streams,
                "queue": s.queue_size,
            }
        )

    async def models(self, request: Request) -> JSONResponse:
        self._authorize(request)
        if wants_anthropic(request):  # Anthropic's shape (messages_api.py)
            return model_list(self)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> JSONResponse:
        self._authorize(request)
        self._check_model(request.path_params["model"])
        if wants_anthropic(request):
            return JSONResponse(model_info(self))
        return JSONResponse(self._model_card())

    async def chat(self, request: Request) -> Any:
        self._authorize(request)
        body, legacy = read_legacy(await self._body(request))
        chat = read_chat(body)
        self._check_model(chat.options.model)
        gen = await self._submit(request, chat, "messages")
        head = self._head("chatcmpl", chat.options)
        if chat.options.stream:
            events = self._chat_events(gen, head, chat.options.include_usage, legacy)
            return sse(events, gen)
        reasoning, content, calls = [], [], []
        async for piece in gen.pieces():
            if piece.kind == "tool_call":
                calls.append(piece.call.as_dict())  # type: ignore[union-attr]
            else:
                (reasoning if piece.kind == "reasoning" else content).append(piece.text)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(content) if content or not calls else None,
        }
        if reasoning:
            message["reasoning_content"] = message["reasoning"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        choice = {
            "index": 0,
            "message": as_function_call(message) if legacy else message,
            "logprobs": self._logprobs(gen, True),
            "finish_reason": finish(gen.finish_reason) if legacy else gen.finish_reason,
        }
        body = {**head, "object": "chat.completion", "choices": [choice], "usage": gen.usage}
        return JSONResponse(_with_timings(body, gen))

    async def completions(self, request: Request) -> Any:
        self._authorize(request)
        req = read_completion(await self._body(request))
        self._check_model(req.options.model)
        gen = await self._submit_completion(request, req)
        head = self._head("cmpl", req.options)
        if req.options.stream:
            return sse(self._completion_events(gen, head, req.options.include_usage), gen)
        text = "".join([piece.text async for piece in gen.pieces()])
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": gen.finish_reason,
            "logprobs": self._logprobs(gen, False),
        }
        body = {**head, "object": "text_completion", "choices": [choice], "usage": gen.usage}
        return JSONResponse(_with_timings(body, gen))

    async def _submit_completion(self, request: Request, req: CompletionRequest) -> Generation:
        """Tokenize (or check the ids of) a completion's prompt, ready its grammar, submit."""
        if isinstance(req.prompt, str):
            ids = await run_in_threadpool(self.tokenizer.encode, req.prompt)
        else:
            ids = req.prompt
            vocab = self.engine.vocab_rows
            if any(not 0 <= t < vocab for t in ids):
                raise bad(f"'prompt' has token ids outside the vocabulary [0, {vocab})", "prompt")
        await self._grammar_ready(req.options)
        return self._start(request, ids, req.options, None)

    async def _submit(
        self,
        request: Request,
        chat: ChatRequest,
        where: str,
        fit: bool = False,
        truncate: bool = False,
        prefix: Sequence[int] = (),
        started: str = "",
    ) -> Generation:
        """Render a chat request, ready its grammar, and submit it (`where`: the field a
        template error names; `fit`: as `_start`; `truncate`: a chat too long for the
        context loses its oldest turns, as Ollama's API does; `prefix`: ids the prompt
        goes on from, Ollama's `context`; `started`: the reply's first words, which it
        goes on from: Anthropic's prefill)."""
        render = self._truncated if truncate else self._render
        try:
            prompt_text, ids = await run_in_threadpool(render, chat, started)
        except TemplateError as exc:
            raise bad(str(exc), where, "template_error") from exc
        ids = [*prefix, *ids]
        splitter = ReplySplitter(
            prompt_opens_thinking(prompt_text),
            bool(chat.tools),
            tool_schemas(chat.tools),
            one_call=chat.one_call,
            lead=not started,
        )
        await self._grammar_ready(chat.options)
        budget = chat.thinking_budget or self.thinking_budget
        return self._start(request, ids, chat.options, splitter, fit, budget)

    # ----- streaming ------------------------------------------------------------------------
    async def _chat_events(
        self, gen: Generation, head: dict, usage: bool, legacy: bool = False
    ) -> AsyncIterator[str]:
        """A chat reply's chunks (`legacy`: its call as the older API's `function_call`)."""
        fmt = LogprobFormat(self.tokenizer)

        def chunk(delta: dict, finish: str | None = None) -> str:
            logprobs = self._logprobs(gen, True, fmt, finish is not None)
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
            body = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            body = _with_timings(body, gen) if finish is not None else body
            return data({**body, "usage": None} if usage else body)

        calls, streamed = 0, None  # calls ended; the id of the one sent as it was written
        try:
            yield chunk({"role": "assistant", "content": ""})
            async for piece in gen.pieces(call_parts=True):
                kind, call = piece.kind, piece.call
                if kind == "reasoning":
                    yield chunk({"reasoning_content": piece.text, "reasoning": piece.text})
                elif kind == "content":
                    yield chunk({"content": piece.text})
                elif legacy and calls:  # the older API held one call a reply
                    continue
                elif kind == "call_start":
                    streamed = call.id  # type: ignore[union-attr]
                    yield chunk(_call_delta(call.as_dict(calls), legacy))  # type: ignore[union-attr]
                elif kind == "call_args":
                    part = {"index": calls, "function": {"arguments": piece.text}}
                    yield chunk(_call_delta(part, legacy))
                else:  # the whole call: sent already, or now
                    if call.id != streamed:  # type: ignore[union-attr]
                        yield chunk(_call_delta(call.as_dict(calls), legacy))  # type: ignore[union-attr]
                    calls += 1
            yield chunk({}, finish(gen.finish_reason) if legacy else gen.finish_reason)
            if usage:
                yield data(
                    {**head, "object": "chat.completion.chunk", "choices": [], "usage": gen.usage}
                )
        except Exception as exc:  # the reply failed after it started: its error, then [DONE]
            yield data(streamed_error(exc).body())
        yield "data: [DONE]\n\n"

    async def _completion_events(
        self, gen: Generation, head: dict, usage: bool
    ) -> AsyncIterator[str]:
        fmt = LogprobFormat(self.tokenizer)

        def chunk(text: str, finish: str | None = None) -> str:
            logprobs = self._logprobs(gen, False, fmt, finish is not None)
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
            body = {**head, "object": "text_completion", "choices": [choice]}
            body = _with_timings(body, gen) if finish is not None else body
            return data({**body, "usage": None} if usage else body)

        try:
            async for piece in gen.pieces():
                yield chunk(piece.text)
            yield chunk("", gen.finish_reason)
            if usage:
                yield data({**head, "object": "text_completion", "choices": [], "usage": gen.usage})
        except Exception as exc:  # the reply failed after it started: its error, then [DONE]
            yield data(streamed_error(exc).body())
        yield "data: [DONE]\n\n"

    # ----- helpers --------------------------------------------------------------------------
    def _logprobs(
        self, gen: Generation, chat: bool, fmt: LogprobFormat | None = None, final: bool = True
    ) -> dict | None:
        """The log-probabilities of the tokens `gen` received since the last call, in the
        endpoint's shape; None where the request did not ask, or (before the final chunk
        of a stream) where no token came."""
        if not gen.wants_logprobs:
            return None
        entries = gen.take_logprobs()
        if not entries and not final:
            return None
        fmt = fmt or LogprobFormat(self.tokenizer)
        return fmt.chat(entries) if chat else fmt.completion(entries)

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":  # Anthropic's clients send it as x-api-key
            token = request.headers.get("x-api-key", "")
        if not token or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(
                401,
                "invalid or missing API key: send the header 'Authorization: Bearer KEY' "
                "(or 'x-api-key: KEY') with the key the server was started with (--api-key)",
                code="invalid_api_key",
            )

    async def _body(self, request: Request) -> dict[str, Any]:
        """The JSON object of the body, read up to `max_body` bytes (body.py)."""
        return await read_json(request, self.max_body)

    def _check_model(self, model: str | None) -> None:
        """`model` is the served one, by its id, or as Ollama's clients name it: with the
        tag ":latest" (`ollama run NAME` and front-ends add it)."""
        if model is not None and model not in (self.model_id, f"{self.model_id}:latest"):
            raise ApiError(
                404,
                f"the model '{model}' is not loaded here; this server serves "
                f"'{self.model_id}' (GET /v1/models lists it)",
                param="model",
                code="model_not_found",
            )

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "snug",
            # The served context, by vLLM's name and by the one OpenRouter's model list uses.
            "max_model_len": self.engine.context,
            "context_length": self.engine.context,
        }

    async def _grammar_ready(self, options: Options) -> None:
        """A held reply's tokenizer for the grammar, built (once, about a second for a large
        vocabulary) here rather than in the engine's loop, where it would stall every stream."""
        if options.grammar is not None:
            await run_in_threadpool(self.engine.grammar_tokenizer.get)

    def _render(self, chat: ChatRequest, started: str = "") -> tuple[str, list[int]]:
        """The chat's prompt, text and ids; `started`: the reply's first words after it."""
        text = self.tokenizer.apply_chat_template(
            chat.messages, True, chat.enable_thinking, chat.tools
        )
        return text + started, self.tokenizer.encode(text + started)

    def _truncated(self, chat: ChatRequest, started: str = "") -> tuple[str, list[int]]:
        """The chat's prompt without its oldest turns where it would not fit the context
        with room for the reply, only as many as must go (engine/context_fit.py; the
        server keeps nothing of a conversation between requests); each prompt rendered
        once."""
        texts: dict[int, str] = {}  # each prompt's text, by its ids

        def chat_ids(messages: list[dict[str, Any]], enable_thinking=None) -> list[int]:
            text, ids = self._render(replace(chat, messages=messages), started)
            texts[id(ids)] = text
            return ids

        view = SimpleNamespace(context=self.engine.context, chat_ids=chat_ids)
        most = chat.options.max_tokens or self.engine.context // 4
        ids, _ = fit_prompt(view, chat.messages, chat.enable_thinking, most, half=False)
        return texts[id(ids)], ids

    def _start(
        self,
        request: Request,
        ids: list[int],
        options: Options,
        splitter: ReplySplitter | None,
        fit: bool = False,
        thinking_budget: int = 0,
    ) -> Generation:
        """Check the prompt and the reply's length against the context, then submit.
        `fit`: a max_tokens past the room left is cut to it (Anthropic's clients send the
        most their model may write, whatever the context), not refused. `thinking_budget`:
        the most tokens the reply thinks (0: no limit; engine/thinking_budget.py)."""
        context, prompt = self.engine.context, len(ids)
        vocab = self.engine.vocab_rows
        outside = [t for t, _ in options.logit_bias if t >= vocab]
        if outside:
            raise bad(
                f"'logit_bias' names token id {outside[0]}, outside the model's vocabulary "
                f"[0, {vocab})",
                "logit_bias",
            )
        if prompt >= context:
            raise bad(
                f"the prompt has {prompt} tokens but the model's context is {context} tokens "
                "(prompt and reply share it); shorten the prompt, or restart the server with "
                "a larger --context",
                "messages",
                "context_length_exceeded",
            )
        room = context - prompt
        if fit and options.max_tokens is not None and options.max_tokens > room:
            options = replace(options, max_tokens=room)
        if options.max_tokens is not None and options.max_tokens > room:
            raise bad(
                f"max_tokens = {options.max_tokens} but the context of {context} tokens leaves "
                f"{room} after the prompt's {prompt}; ask for at most {room}",
                "max_tokens",
                "context_length_exceeded",
            )
        if self.closing:
            raise shutting_down()
        try:
            params = options.params(options.max_tokens or room)
            gen = Generation(
                self.scheduler,
                ids,
                params,
                options.stop,
                splitter,
                options.ignore_eos,
                None if options.stream else request.is_disconnected,
                thinking_budget,
            )
        except QueueFull as exc:
            raise ApiError(503, str(exc), "server_overloaded", code="queue_full") from exc
        except SnugError as exc:  # RequestRefused, a sampling setting out of range
            raise bad(str(exc)) from exc
        self.live.add(gen)
        return gen

    def _head(self, prefix: str, options: Options) -> dict[str, Any]:
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": options.model or self.model_id,
        }


def _with_timings(body: dict, gen: Generation) -> dict:
    """`body` with llama.cpp's `timings` object (`Generation.timings`) where the reply has
    them: OpenAI clients ignore the field, llama.cpp's clients read tokens/s from it."""
    timings = gen.timings
    return body if timings is None else {**body, "timings": timings}


def _call_delta(part: dict[str, Any], legacy: bool) -> dict[str, Any]:
    """A chunk's delta for part of a call (`part` as one entry of `tool_calls`), or as the
    older API's `function_call` (`legacy`): its function alone."""
    return {"function_call": part["function"]} if legacy else {"tool_calls": [part]}
