"""llama.cpp's own completion API (`POST /completion`, `GET /props`, `GET /slots`), for the
clients that speak it rather than OpenAI's: editor plugins and chat front-ends with a "llama.cpp"
backend. A request is read as the completion request it stands for (engine/server/
protocol.py) and runs on the same path; the answer is llama.cpp's: `content`, the counts
(`tokens_predicted`, `tokens_evaluated`, `tokens_cached`), why it stopped (`stop_type`
"eos", "limit" or "word", with `stopping_word`), `timings`, and with `n_probs` each token's
`completion_probabilities`. `stream` sends the text piece by piece as server-sent events,
the last with `stop: true` and the figures.

Its names: `n_predict` (-1, the default: until the reply ends or the context is full; a
count past the context's room also runs until it is full, as llama.cpp's server does; 0:
no token written, the prompt read into the prompt cache, as clients warm it ahead),
`temperature`, `top_k`, `top_p`, `min_p`, `presence_penalty`, `frequency_penalty`, `seed`
(-1: none), `stop`, `ignore_eos`, `logit_bias` (`[[id, bias], ...]`, `false` bars a token),
`json_schema`, `return_tokens`. Its samplers this engine does not have (`repeat_penalty`,
`mirostat`, `typical_p`, `dry_*`, `xtc_*`) and its slot controls (`cache_prompt`: the
prompt cache is always on; `id_slot`) are passed over, as Ollama's options are; a GBNF
`grammar` is refused by name (`json_schema` holds a reply to a schema).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from engine import __version__
from engine.scheduler import Request as SchedulerRequest
from engine.scheduler import Scheduler
from engine.server.generation import Generation
from engine.server.logprobs import LogprobFormat
from engine.server.protocol import (
    ApiError,
    bad,
    field,
    loose_sampling,
    read_completion,
    read_options,
    streamed_error,
)
from engine.server.sse import data, sse

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer

# llama.cpp's names that are the OpenAI request's too; `temperature` and `top_p` are read
# as its sampler takes them (any temperature; protocol.loose_sampling), after the request.
SAME = ("top_k", "min_p", "presence_penalty", "frequency_penalty")
SAME += ("seed", "stop", "ignore_eos", "stream", "model")
# The sampling /props and /slots report, by llama.cpp's names (the engine's own).
KNOBS = ("temperature", "top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty")


class LlamaApi:
    """The routes, over the server's path (`OpenAIServer`)."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server

    def routes(self) -> list[tuple[str, Any, str]]:
        return [
            ("/completion", self.completion, "POST"),
            ("/props", self.props, "GET"),
            ("/slots", self.slots, "GET"),
        ]

    async def completion(self, request: Request) -> Response:
        s = self.server
        s._authorize(request)
        body = await s._body(request)
        req = read_completion(openai_body(body))
        req = replace(req, options=loose_sampling(req.options, body))
        s._check_model(req.options.model)
        gen = await s._submit_completion(request, req, fit=True)  # to the context's end
        answer = _Answer(s, gen, body)
        if req.options.stream:
            return sse(answer.events(), gen)
        text = "".join([piece.text async for piece in answer.pieces()])
        return JSONResponse(answer.final(text))

    @staticmethod
    def prompt_only(body: dict) -> bool:
        """`n_predict` 0: the prompt read, its one token drawn and left out of the reply."""
        return body.get("n_predict") == 0

    async def props(self, request: Request) -> JSONResponse:
        """The server's settings as llama.cpp's `/props` gives them: the context a client
        reads to size its prompts, the sampling a completion that names none runs with
        (a prompt that does not open a thinking block), the slots (streams), the chat
        template."""
        s = self.server
        s._authorize(request)
        template = s.tokenizer.template if isinstance(s.tokenizer.template, str) else ""
        used = read_options({}, None, chat=False).params(1)
        params = {"n_predict": -1, "seed": -1, "stop": []} | _knobs(used)
        return JSONResponse(
            {
                "default_generation_settings": {
                    "n_ctx": s.engine.context,
                    "model": s.model_id,
                    "params": params,
                },
                "total_slots": s.engine.streams,
                "model_path": str(s.engine.model_dir),
                "model_alias": s.model_id,
                "chat_template": template,
                "modalities": {"vision": False, "audio": False},
                "build_info": f"snug {__version__}",
            }
        )

    async def slots(self, request: Request) -> JSONResponse:
        """llama.cpp's `GET /slots`: a slot (stream) each, busy or idle, with the context it
        holds and, at work, its request: the prompt's counts, the sampling, the tokens
        decoded and left, the text so far. `?fail_on_no_slot=1`: 503 where none is idle,
        as llama.cpp answers load balancers that ask."""
        s = self.server
        s._authorize(request)
        working = _working(s.scheduler)
        if request.query_params.get("fail_on_no_slot") == "1" and len(working) >= s.engine.streams:
            message = (
                f"no slot available: all {s.engine.streams} slots (streams) are busy; retry "
                "once one is idle"
            )
            raise ApiError(503, message, "unavailable_error", code="unavailable")
        speculative = s.engine.drafter is not None
        out = []
        for slot in range(s.engine.streams):
            entry = {"id": slot, "n_ctx": s.engine.context, "speculative": speculative}
            entry["is_processing"] = slot in working
            if slot in working:
                entry |= _task(working[slot], s.tokenizer)
            out.append(entry)
        return JSONResponse(out)


def _knobs(params: Any) -> dict[str, Any]:
    return {name: getattr(params, name) for name in KNOBS}


def _working(scheduler: Scheduler) -> dict[int, SchedulerRequest]:
    """The scheduler's requests that hold a stream, by slot, each request's stream read
    once (it is let go of at the request's end)."""
    out = {}
    for request in scheduler.working():
        stream = request.stream
        if stream is not None:
            out[stream.slot] = request
    return out


def _task(request: SchedulerRequest, tokenizer: Any) -> dict[str, Any]:
    """A busy slot's request in llama.cpp's words (its server_slot::to_json)."""
    params, generated = request.params, list(request.generated)
    stream = request.stream
    reused = stream.reused if stream is not None else 0
    prompt = len(request.prompt_ids)
    text = tokenizer.decode(generated)
    n_predict = params.max_new_tokens
    return {
        "id_task": request.id,
        "n_prompt_tokens": prompt,
        "n_prompt_tokens_processed": max(prompt - reused - len(request.todo), 0),
        "n_prompt_tokens_cache": reused,
        "params": {
            "seed": params.seed if params.seed is not None else -1,
            **_knobs(params),
            "max_tokens": n_predict,
            "n_predict": n_predict,
            "ignore_eos": request.ignore_eos,
            "n_probs": params.logprobs or 0,
        },
        "next_token": [
            {
                "has_next_token": not request.done.is_set(),
                "has_new_line": "\n" in text,
                "n_remain": max(n_predict - len(generated), 0),
                "n_decoded": len(generated),
            }
        ],
        "prompt": tokenizer.decode(request.prompt_ids),
        "generated": text,
    }


def openai_body(body: dict) -> dict:
    """llama.cpp's completion request as the OpenAI completion request it stands for."""
    out = {name: body[name] for name in SAME if name in body}
    prompt = body.get("prompt")
    if isinstance(prompt, list) and any(isinstance(p, str) for p in prompt):
        raise bad("'prompt' must be one string or one list of token ids here", "prompt")
    out["prompt"] = prompt
    n_predict = field(body, "n_predict", "integer", -1)
    if n_predict < -1:
        message = (
            f"'n_predict' = {n_predict} must be -1 (until the end), 0 (the prompt only) or a count"
        )
        raise bad(message, "n_predict")
    # -1: the context's room, as LM Studio's clients ask too; 0: one token, which the
    # reply leaves out (the prompt's state is kept once a token is drawn after it).
    out["max_tokens"] = n_predict or 1
    probs = field(body, "n_probs", "integer", 0)
    if probs:
        out["logprobs"] = probs
    bias = body.get("logit_bias")
    if bias:
        out["logit_bias"] = _bias(bias)
    if body.get("grammar"):
        raise bad("a GBNF 'grammar' is not read here: send the reply's 'json_schema'", "grammar")
    schema = body.get("json_schema")
    if schema:
        out["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    return out


def _bias(raw: Any) -> dict[str, float]:
    """llama.cpp's `logit_bias` (`[[id, bias], ...]`, where `false` bars the token, or an
    object of ids) as OpenAI's."""
    pairs = raw.items() if isinstance(raw, dict) else raw
    out: dict[str, float] = {}
    try:
        for token, value in pairs:
            out[str(int(token))] = -100.0 if value is False else float(value)
    except (TypeError, ValueError):
        message = "'logit_bias' must be [[token id, bias], ...] or {token id: bias}"
        raise bad(message, "logit_bias") from None
    return out


class _Answer:
    """One reply in llama.cpp's shape."""

    def __init__(self, server: OpenAIServer, gen: Generation, body: dict) -> None:
        self.server, self.gen, self.body = server, gen, body
        self.fmt = LogprobFormat(server.tokenizer)
        self.probs: list[dict[str, Any]] = []
        self.prompt_only = LlamaApi.prompt_only(body)  # nothing of the reply is given
        # The end of sequence is no token of the reply's text (unless `ignore_eos`).
        self.ends = frozenset() if body.get("ignore_eos") is True else server.engine.eos_ids
        self.slot = -1  # the slot (stream) that runs it, once known

    async def pieces(self) -> AsyncIterator[Any]:
        """The reply's pieces, noting the slot that runs it (`id_slot`) as they come: the
        request lets go of its stream at its end."""
        async for piece in self.gen.pieces():
            stream = self.gen.request.stream
            if stream is not None:
                self.slot = stream.slot
            yield piece

    async def events(self) -> AsyncIterator[str]:
        """The reply's events, each with its text and the ids of the tokens received since
        the last (llama.cpp's `tokens`), then the last event with the figures."""
        gen, text, sent = self.gen, [], 0
        try:
            async for piece in self.pieces():
                if self.prompt_only:
                    continue
                text.append(piece.text)
                ids = gen.reply_ids
                tokens, sent = [t for t in ids[sent:] if t not in self.ends], len(ids)
                chunk = {"index": 0, "content": piece.text, "tokens": tokens, "stop": False}
                chunk |= {"id_slot": self.slot, "tokens_predicted": gen.completion_tokens}
                chunk |= {"tokens_evaluated": gen.prompt_tokens}
                yield data(self._with_probs(chunk))
            yield data({**self.final("".join(text)), "content": ""})
        except Exception as exc:  # the reply failed after it started: its error, in its shape
            yield data(streamed_error(exc).body())

    def final(self, text: str) -> dict[str, Any]:
        if self.prompt_only:
            return self._with_probs(self._prompt_only(self._final("", "limit", "")))
        gen = self.gen
        word = gen.stop.which if gen.stop.hit else ""
        stop_type = "word" if word else "limit" if gen.finish_reason == "length" else "eos"
        return self._with_probs(self._final(text, stop_type, word))

    def _final(self, text: str, stop_type: str, word: str) -> dict[str, Any]:
        gen, s, params = self.gen, self.server, self.gen.params
        return {
            "index": 0,
            "content": text,
            "tokens": gen.reply_ids if field(self.body, "return_tokens", "boolean", False) else [],
            "id_slot": self.slot,
            "stop": True,
            "model": s.model_id,
            "tokens_predicted": gen.completion_tokens,
            "tokens_evaluated": gen.prompt_tokens,
            "tokens_cached": gen.cached_tokens,
            "generation_settings": {
                "n_ctx": s.engine.context,
                "n_predict": params.max_new_tokens,
                "temperature": params.temperature,
                "top_k": params.top_k,
                "top_p": params.top_p,
                "min_p": params.min_p,
                "seed": params.seed if params.seed is not None else -1,
                "stop": list(gen.stop.stops),
            },
            "prompt": self.body.get("prompt") if isinstance(self.body.get("prompt"), str) else "",
            "has_new_line": "\n" in text,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": word,
            "timings": gen.timings or {},
        }

    @staticmethod
    def _prompt_only(out: dict[str, Any]) -> dict[str, Any]:
        """The last event of a reply asked for none (`n_predict` 0): the token drawn to keep
        the prompt's state is not counted, nor timed."""
        out |= {"tokens": [], "tokens_predicted": 0}
        out["generation_settings"]["n_predict"] = 0
        out["timings"] = {
            k: 0 if k.startswith("predicted") else v for k, v in out["timings"].items()
        }
        return out

    def _with_probs(self, out: dict[str, Any]) -> dict[str, Any]:
        """`completion_probabilities` of the tokens since the last chunk, where asked."""
        if not self.gen.wants_logprobs:
            return out
        taken = self.gen.take_logprobs()
        if self.prompt_only:
            return {**out, "completion_probabilities": []}
        entries = []
        for (token, lp), entry in zip(taken, self.fmt.chat(taken)["content"], strict=True):
            tops = [
                {"id": alt, **top}
                for (alt, _), top in zip(lp.top, entry["top_logprobs"], strict=True)
            ]
            entries.append({"id": token, **entry, "top_logprobs": tops})
        return {**out, "completion_probabilities": entries}
