"""The ASGI app: OpenAI's chat completions, completions and models, over one Scheduler.

    GET  /health                 liveness, streams running and waiting (no key needed)
    GET  /v1/models              the one loaded model (Anthropic's shape with anthropic-version)
    POST /v1/chat/completions    chat template (tools included), thinking apart, tool calls,
                                 `n` replies (openai_api.py)
    POST /v1/completions         prompt strings or token ids, as they are (a batch, `n` each)
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
from collections.abc import Sequence
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
from engine.constraint import opens_thinking
from engine.context_fit import fit_prompt
from engine.errors import SnugError, TemplateError
from engine.scheduler import QueueFull, Scheduler
from engine.server.body import read_json
from engine.server.chat_request import ChatRequest, tool_schemas
from engine.server.errors import api_error, http_error, shutting_down
from engine.server.generation import Generation
from engine.server.llama_api import LlamaApi
from engine.server.messages_api import MessagesApi, model_info, model_list, wants_anthropic
from engine.server.ollama import OllamaApi
from engine.server.openai_api import ChatCompletionsApi
from engine.server.protocol import ApiError, CompletionRequest, Options, bad
from engine.server.reply import ReplySplitter, prompt_opens_thinking
from engine.server.response_store import ResponsesApi
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
            *ChatCompletionsApi(self).routes(),
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

    async def _submit_completion(
        self, request: Request, req: CompletionRequest, fit: bool = False
    ) -> Generation:
        """A completion of one prompt: its ids, its grammar readied, submitted (`fit`: as
        `_start`)."""
        ids = await self._completion_ids(req.prompt)
        await self._grammar_ready(req.options)
        return self._start(request, ids, req.options, None, fit)

    async def _completion_ids(self, prompt: str | list[int]) -> list[int]:
        """A completion's prompt tokenized, or its ids checked against the vocabulary."""
        if isinstance(prompt, str):
            return await run_in_threadpool(self.tokenizer.encode, prompt)
        vocab = self.engine.vocab_rows
        if any(not 0 <= t < vocab for t in prompt):
            raise bad(f"'prompt' has token ids outside the vocabulary [0, {vocab})", "prompt")
        return prompt

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
        prompt_text, ids = await self._prompt(chat, where, truncate, started)
        await self._grammar_ready(chat.options)
        ids = [*prefix, *ids]
        return self._start_chat(request, chat, prompt_text, ids, chat.options, fit, started)

    async def _prompt(
        self, chat: ChatRequest, where: str, truncate: bool = False, started: str = ""
    ) -> tuple[str, list[int]]:
        """The chat's prompt, text and ids, rendered on a thread (`_submit`'s arguments)."""
        render = self._truncated if truncate else self._render
        try:
            return await run_in_threadpool(render, chat, started)
        except TemplateError as exc:
            raise bad(str(exc), where, "template_error") from exc

    def _start_chat(
        self,
        request: Request,
        chat: ChatRequest,
        prompt_text: str,
        ids: list[int],
        options: Options,
        fit: bool = False,
        started: str = "",
    ) -> Generation:
        """Submit one reply to a rendered chat (`options`: the chat's, or one choice's)."""
        splitter = ReplySplitter(
            prompt_opens_thinking(prompt_text),
            chat.reads_calls,
            tool_schemas(chat.tools),
            one_call=chat.one_call,
            lead=not started,
        )
        budget = chat.thinking_budget or self.thinking_budget
        return self._start(request, ids, options, splitter, fit, budget)

    def _check_replies(self, replies: int) -> None:
        """A request's replies (its `n`, times a completion's prompts) are each a request
        to the scheduler: refused at once where they could never all be taken together."""
        s = self.scheduler
        if replies > s.capacity:
            raise bad(
                f"the request asks for {replies} replies ('n' times the prompts) but this "
                f"server takes at most {s.capacity} at once ({s.engine.streams} streams, "
                f"{s.queue_size} waiting); ask for fewer, or {s.more_room}",
                "n",
            )

    # ----- helpers --------------------------------------------------------------------------
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
                f"{options.limit_name} = {options.max_tokens} but the context of {context} "
                f"tokens leaves {room} after the prompt's {prompt}; ask for at most {room}",
                options.limit_name,
                "context_length_exceeded",
            )
        if self.closing:
            raise shutting_down()
        try:
            # The reply's mode, for its sampling defaults: a chat's splitter has read it
            # from the prompt's text; a completion's ids are read for it.
            if splitter is not None:
                thinks = splitter.mode == "reasoning"
            else:
                thinks = opens_thinking(ids, self.tokenizer)
            params = options.params(options.max_tokens or room, thinks)
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
