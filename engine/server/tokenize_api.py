"""The prompt as tokens, and tokens as text: the utility routes vLLM's and llama.cpp's
servers answer, for clients that count a conversation's tokens against the context before
they send it (chat front-ends that trim history, evaluation and training harnesses).

  POST /tokenize        vLLM: `prompt` (text), or `messages` (with `tools`,
                        `add_generation_prompt`, `chat_template_kwargs`) rendered by the
                        model's chat template as the chat route renders them; answers
                        `count`, `max_model_len` (the served context), `tokens` and, with
                        `return_token_strs`, `token_strs`. llama.cpp: `content` (with
                        `parse_special: false`, special tokens' text read as plain text);
                        answers `tokens`, each with its `piece` (its text, or its bytes
                        where they are not whole UTF-8) with `with_pieces`.
  POST /detokenize      `tokens` -> the text, as vLLM's `prompt` and llama.cpp's `content`
  POST /apply-template  llama.cpp: `messages` -> the rendered `prompt`

Qwen3.5's tokenizer adds no special tokens to a text (no BOS), so `add_special_tokens` and
`add_special` change nothing; the special tokens written in a text (`<|im_start|>`) are
read as themselves, as both servers read them by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from tokenizers import Tokenizer as HfTokenizer

from engine.errors import TemplateError
from engine.server.chat_request import read_chat
from engine.server.protocol import bad, field

if TYPE_CHECKING:
    from engine.server.app import OpenAIServer

MAX_IDS = 1 << 20  # a /detokenize request's ids at most


def _text(body: dict, name: str) -> str:
    """The text to tokenize, `body[name]`: a string (null is refused by name too)."""
    text = field(body, name, "string")
    if text is None:
        raise bad(f"'{name}' must be of type string, got null", name)
    return text


class TokenizeApi:
    """The routes, over the server's tokenizer and template (`OpenAIServer`)."""

    def __init__(self, server: OpenAIServer) -> None:
        self.server = server
        self._plain: HfTokenizer | None = None  # reads special tokens' text as text

    def routes(self) -> list[tuple[str, Any, str]]:
        return [
            ("/tokenize", self.tokenize, "POST"),
            ("/detokenize", self.detokenize, "POST"),
            ("/apply-template", self.apply_template, "POST"),
        ]

    async def tokenize(self, request: Request) -> JSONResponse:
        s = self.server
        s._authorize(request)
        body = await s._body(request)
        s._check_model(field(body, "model", "string"))
        if "content" in body:  # llama.cpp's request
            text = _text(body, "content")
            special = field(body, "parse_special", "boolean", True)
            encode = s.tokenizer.encode if special else self._encode_plain
            ids = await run_in_threadpool(encode, text)
            if not field(body, "with_pieces", "boolean", False):
                return JSONResponse({"tokens": ids})
            return JSONResponse({"tokens": [{"id": t, "piece": self._piece(t)} for t in ids]})
        if "messages" in body:
            text = await self._rendered(body)
        elif "prompt" in body:
            text = _text(body, "prompt")
        else:
            raise bad(
                "/tokenize takes 'prompt' or 'messages' (as vLLM's server), or 'content' "
                "(as llama.cpp's)",
                "prompt",
            )
        ids = await run_in_threadpool(s.tokenizer.encode, text)
        strs = field(body, "return_token_strs", "boolean", False)
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": s.engine.context,
                "tokens": ids,
                "token_strs": [self._token_str(t) for t in ids] if strs else None,
            }
        )

    async def detokenize(self, request: Request) -> JSONResponse:
        s = self.server
        s._authorize(request)
        body = await s._body(request)
        s._check_model(field(body, "model", "string"))
        ids = body.get("tokens")
        if not isinstance(ids, list) or len(ids) > MAX_IDS:
            raise bad(f"'tokens' must be a list of at most {MAX_IDS:,} token ids", "tokens")
        vocab = s.engine.vocab_rows
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise bad(f"'tokens' holds an id that is not in the vocabulary [0, {vocab})", "tokens")
        text = await run_in_threadpool(s.tokenizer.decode, ids)
        return JSONResponse({"prompt": text, "content": text})

    async def apply_template(self, request: Request) -> JSONResponse:
        s = self.server
        s._authorize(request)
        body = await s._body(request)
        s._check_model(field(body, "model", "string"))
        return JSONResponse({"prompt": await self._rendered(body)})

    async def _rendered(self, body: dict) -> str:
        """The prompt text the chat template makes of the request's `messages` (and
        `tools`, `chat_template_kwargs`), as the chat route renders them."""
        chat = read_chat({**body, "stream": False})  # its model checked by the route
        generation = field(body, "add_generation_prompt", "boolean", True)
        tok = self.server.tokenizer
        try:
            return await run_in_threadpool(
                tok.apply_chat_template, chat.messages, generation, chat.enable_thinking, chat.tools
            )
        except TemplateError as exc:
            raise bad(str(exc), "messages", "template_error") from exc

    def _encode_plain(self, text: str) -> list[int]:
        """`text`'s ids with special tokens' text (`<|im_start|>`) read as plain text, by a
        copy of the tokenizer made for it (the served one reads them as the tokens)."""
        if self._plain is None:
            plain = HfTokenizer.from_str(self.server.tokenizer.hf_json())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain.encode(text, add_special_tokens=False).ids

    def _piece(self, token: int) -> str | list[int]:
        """A token's text as llama.cpp gives it: a string where its bytes are whole UTF-8,
        else the bytes' values."""
        raw = self.server.tokenizer.token_bytes(token)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    def _token_str(self, token: int) -> str:
        """A token as the vocabulary spells it (vLLM's `token_strs`: byte-level BPE's
        `Ġ` for a space)."""
        return self.server.tokenizer.id_to_token(token) or ""
