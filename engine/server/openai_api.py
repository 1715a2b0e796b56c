"""OpenAI's chat completions and completions (`POST /v1/chat/completions`, `/v1/completions`)
over the server's path (`OpenAIServer`: auth, body, model check, rendering and submission
are the server's).

A request may ask for `n` replies, and a completion for a batch of prompts: each reply is a
request of its own to the scheduler (drawn apart: a seed moves on by one a reply), returned
as the choice of its index (prompt i's reply j is choice i * n + j, as OpenAI numbers
them). A stream sends each choice's chunks as they come, interleaved. The usage counts each
prompt once and every reply's tokens. If one reply cannot be submitted (the queue full) or
fails, the others are cancelled: a refused request leaves nothing running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from engine.server.chat_request import read_chat
from engine.server.generation import Generation
from engine.server.legacy import as_function_call, finish, read_legacy
from engine.server.logprobs import LogprobFormat
from engine.server.protocol import read_completion, streamed_error
from engine.server.sse import data, sse

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer


class Choices:
    """One request's replies, `n` to each of its prompts, in choice order."""

    def __init__(self, n: int, gens: list[Generation]) -> None:
        self.n, self.gens = n, gens

    @classmethod
    def submitted(cls, n: int, starts: Iterable[Callable[[], Generation]]) -> Choices:
        """Each reply submitted in turn (`starts`); if one is refused, those before it are
        cancelled and the refusal raised."""
        gens: list[Generation] = []
        try:
            for start in starts:
                gens.append(start())
        except BaseException:
            for gen in gens:
                gen.cancel()
            raise
        return cls(n, gens)

    def cancel(self) -> None:
        for gen in self.gens:
            gen.cancel()  # no-op once a reply has ended

    @property
    def usage(self) -> dict[str, Any]:
        """OpenAI's usage: each prompt's tokens once, every reply's tokens."""
        firsts = self.gens[:: self.n]  # one reply to each prompt
        prompt = sum(g.prompt_tokens for g in firsts)
        written = sum(g.completion_tokens for g in self.gens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": written,
            "total_tokens": prompt + written,
            "completion_tokens_details": {
                "reasoning_tokens": sum(g.reasoning_tokens for g in self.gens)
            },
            "prompt_tokens_details": {"cached_tokens": sum(g.cached_tokens for g in firsts)},
        }

    async def each(self, make: Callable[[Generation, int], Any]) -> list[Any]:
        """`make(reply, index)` for every reply, side by side; the first failure cancels
        the others and is raised as it is."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(make(g, i)) for i, g in enumerate(self.gens)]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        finally:
            self.cancel()
        return [task.result() for task in tasks]

    async def chunks(self, of: Callable[[Generation, int], AsyncIterator[dict]]) -> AsyncIterator:
        """Every reply's chunks (`of(reply, index)`), each as it comes; the first failure
        cancels the others and is raised."""
        if len(self.gens) == 1:
            async for chunk in of(self.gens[0], 0):
                yield chunk
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()
        ended = object()

        async def pump(stream: AsyncIterator[dict]) -> None:
            try:
                async for chunk in stream:
                    queue.put_nowait(chunk)
                queue.put_nowait(ended)
            except Exception as exc:
                queue.put_nowait(exc)

        tasks = [asyncio.create_task(pump(of(g, i))) for i, g in enumerate(self.gens)]
        try:
            left = len(tasks)
            while left:
                item = await queue.get()
                if item is ended:
                    left -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.cancel()


class ChatCompletionsApi:
    """The two routes, over the server's path (`OpenAIServer`)."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server

    def routes(self) -> list[tuple[str, Any, str]]:
        return [
            ("/chat/completions", self.chat, "POST"),
            ("/completions", self.completions, "POST"),
        ]

    async def chat(self, request: Request) -> Any:
        s = self.server
        s._authorize(request)
        body, legacy = read_legacy(await s._body(request))
        chat = read_chat(body)
        options, n = chat.options, chat.options.n
        s._check_model(options.model)
        s._check_replies(n)
        text, ids = await s._prompt(chat, "messages")
        await s._grammar_ready(options)
        starts = (
            partial(s._start_chat, request, chat, text, ids, options.choice(i)) for i in range(n)
        )
        choices = Choices.submitted(n, starts)
        head = s._head("chatcmpl", options)
        if options.stream:
            chunks = partial(
                self._chat_chunks, head=head, usage=options.include_usage, legacy=legacy
            )
            events = _events(choices, chunks, head, "chat.completion.chunk", options.include_usage)
            return sse(events, choices)
        made = await choices.each(partial(self._chat_choice, legacy=legacy))
        body = {**head, "object": "chat.completion", "choices": made, "usage": choices.usage}
        return JSONResponse(_with_timings(body, choices))

    async def completions(self, request: Request) -> Any:
        s = self.server
        s._authorize(request)
        req = read_completion(await s._body(request))
        options, n = req.options, req.options.n
        s._check_model(options.model)
        s._check_replies(n * len(req.prompts))
        prompts = [await s._completion_ids(prompt) for prompt in req.prompts]
        await s._grammar_ready(options)
        starts = (
            partial(s._start, request, ids, options.choice(j), None)
            for ids in prompts
            for j in range(n)
        )
        choices = Choices.submitted(n, starts)
        head = s._head("cmpl", options)
        if options.stream:
            chunks = partial(self._text_chunks, head=head, usage=options.include_usage)
            events = _events(choices, chunks, head, "text_completion", options.include_usage)
            return sse(events, choices)
        made = await choices.each(self._text_choice)
        body = {**head, "object": "text_completion", "choices": made, "usage": choices.usage}
        return JSONResponse(_with_timings(body, choices))

    # ----- one reply ------------------------------------------------------------------------
    async def _chat_choice(self, gen: Generation, index: int, legacy: bool) -> dict[str, Any]:
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
        return {
            "index": index,
            "message": as_function_call(message) if legacy else message,
            "logprobs": self._logprobs(gen, True),
            "finish_reason": finish(gen.finish_reason) if legacy else gen.finish_reason,
        }

    async def _text_choice(self, gen: Generation, index: int) -> dict[str, Any]:
        text = "".join([piece.text async for piece in gen.pieces()])
        return {
            "index": index,
            "text": text,
            "finish_reason": gen.finish_reason,
            "logprobs": self._logprobs(gen, False),
        }

    async def _chat_chunks(
        self, gen: Generation, index: int, head: dict, usage: bool, legacy: bool = False
    ) -> AsyncIterator[dict]:
        """A chat reply's chunks (`legacy`: its call as the older API's `function_call`)."""
        fmt = LogprobFormat(self.server.tokenizer)

        def chunk(delta: dict, end: str | None = None) -> dict:
            logprobs = self._logprobs(gen, True, fmt, end is not None)
            choice = {"index": index, "delta": delta, "finish_reason": end, "logprobs": logprobs}
            body = {**head, "object": "chat.completion.chunk", "choices": [choice]}
            body = _with_timings(body, gen) if end is not None else body
            return {**body, "usage": None} if usage else body

        calls, streamed = 0, None  # calls ended; the id of the one sent as it was written
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

    async def _text_chunks(
        self, gen: Generation, index: int, head: dict, usage: bool
    ) -> AsyncIterator[dict]:
        fmt = LogprobFormat(self.server.tokenizer)

        def chunk(text: str, end: str | None = None) -> dict:
            logprobs = self._logprobs(gen, False, fmt, end is not None)
            choice = {"index": index, "text": text, "finish_reason": end, "logprobs": logprobs}
            body = {**head, "object": "text_completion", "choices": [choice]}
            body = _with_timings(body, gen) if end is not None else body
            return {**body, "usage": None} if usage else body

        async for piece in gen.pieces():
            yield chunk(piece.text)
        yield chunk("", gen.finish_reason)

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
        fmt = fmt or LogprobFormat(self.server.tokenizer)
        return fmt.chat(entries) if chat else fmt.completion(entries)


async def _events(
    choices: Choices,
    chunks: Callable[[Generation, int], AsyncIterator[dict]],
    head: dict,
    kind: str,
    usage: bool,
) -> AsyncIterator[str]:
    """A stream's events: every choice's chunks, the usage where asked, then [DONE]; a
    reply that fails after the stream started: its error, then [DONE]."""
    try:
        async for chunk in choices.chunks(chunks):
            yield data(chunk)
        if usage:
            yield data({**head, "object": kind, "choices": [], "usage": choices.usage})
    except Exception as exc:
        yield data(streamed_error(exc).body())
    yield "data: [DONE]\n\n"


def _with_timings(body: dict, of: Generation | Choices) -> dict:
    """`body` with llama.cpp's `timings` object (`Generation.timings`) where the reply has
    them: OpenAI clients ignore the field, llama.cpp's clients read tokens/s from it (a
    request of several replies has none)."""
    if isinstance(of, Choices):
        if len(of.gens) != 1:
            return body
        of = of.gens[0]
    timings = of.timings
    return body if timings is None else {**body, "timings": timings}


def _call_delta(part: dict[str, Any], legacy: bool) -> dict[str, Any]:
    """A chunk's delta for part of a call (`part` as one entry of `tool_calls`), or as the
    older API's `function_call` (`legacy`): its function alone."""
    return {"function_call": part["function"]} if legacy else {"tool_calls": [part]}
