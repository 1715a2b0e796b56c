"""Replies held to a JSON schema: the OpenAI API's `response_format` (JSON mode and
structured outputs), as vLLM and llama.cpp's server serve it.

A grammar (llguidance's, compiled from the schema) says which tokens may come next; the
sampler sets every other token's logit to -inf before it picks, so the reply is valid by
construction, not checked after the fact. llguidance does the parsing: a JSON-schema compiler
and a token-level matcher fast enough to run on every step of a 248K vocabulary are what it
exists for, and llama.cpp, vLLM and SGLang use it for the same job.

Where the prompt leaves a `<think>` block open (Qwen3.5's thinking), the thinking is free and
the grammar starts after `</think>`, so the model still reasons before it answers. A held
reply samples on the host: the step's logits come back to it (a megabyte a step for a 248K
vocabulary), and drafting and the device's sampler are not used for it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.errors import RequestRefused
from engine.tokenizer import THINK_CLOSE, THINK_OPEN

log = logging.getLogger(__name__)

# Whitespace between JSON tokens as formatters write it: one space, or a line break and an
# indent; never without end (a model that likes spaces could otherwise fill the reply).
WHITESPACE = r"(\n[ \t]{0,20}|[ ])?"
LEAD = r"[ \t\n]{0,4}"


def json_grammar(schema: dict[str, Any] | None, where: str, strict: bool = True) -> str:
    """The grammar of JSON text matching `schema` (None: any JSON object). Raises
    RequestRefused naming `where` (the request's field) when the schema cannot be compiled.
    Not `strict` (OpenAI's `strict: false`, its default): keywords and string formats the
    grammar cannot hold (`uniqueItems`, pydantic's `set`; `format: binary`) are left to the
    client's own validation rather than refused; the rest of the schema still holds."""
    return _grammar("", {"type": "object"} if schema is None else schema, "", where, strict)


def tool_call_grammar(tools: list[dict[str, Any]], name: str | None, where: str) -> str:
    """The grammar of one tool call (`tool_choice` "required", or the tool `name`): a
    `<tool_call>` block holding `{"name": ..., "arguments": {...}}`, the arguments held to
    the tool's parameters. This is the JSON form of Qwen's tool calls (Qwen2.5 and Qwen3
    write it; engine.server.reply reads it beside Qwen3.5's own form). A tool marked
    `strict: true` must compile whole (as `json_grammar` with `strict`); the others' parameters
    are held as far as the grammar can hold them."""
    calls = []
    for tool in tools:
        fn = tool["function"]
        if name is None or fn["name"] == name:
            arguments = fn.get("parameters") or {"type": "object"}
            if fn.get("strict") is True:
                _grammar("", arguments, "", where, strict=True)  # refused here if it cannot
            calls.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": fn["name"]}, "arguments": arguments},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
            )
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return _grammar('"<tool_call>\\n"', schema, '"\\n</tool_call>"', where, strict=False)


def _grammar(before: str, schema: dict[str, Any], after: str, where: str, strict: bool) -> str:
    """llguidance's grammar of `before` (lark), JSON text matching `schema`, `after`; not
    `strict`: llguidance's `lenient` (keywords it does not implement, and unknown formats,
    are passed over; a schema that is wrong is still refused)."""
    from llguidance import LLMatcher

    given = schema.get("x-guidance")  # llguidance's own options, where a client sets them
    options = {"whitespace_pattern": WHITESPACE, **({} if strict else {"lenient": True})}
    options |= given if isinstance(given, dict) else {}
    try:
        text = json.dumps({**schema, "x-guidance": options})
    except (TypeError, ValueError) as exc:
        raise RequestRefused(f"'{where}' is not a usable JSON schema: {exc}") from exc
    # A line break or two may come first: Qwen3.5 writes them after `</think>`.
    grammar = LLMatcher.grammar_from_lark(f"start: /{LEAD}/ {before} %json {text} {after}")
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise RequestRefused(f"'{where}' is not a usable JSON schema: {error.strip()[:300]}")
    return grammar


class GrammarTokenizer:
    """llguidance's view of a model's tokenizer, built once per model on first use (about a
    second for a 248K vocabulary) from any thread."""

    def __init__(self, tokenizer: Any, vocab_rows: int, eos_ids: Sequence[int]) -> None:
        self._source = (tokenizer, vocab_rows, tuple(eos_ids))
        self._built: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._built is None:
                from llguidance import LLTokenizer

                tokenizer, vocab_rows, eos_ids = self._source
                text = tokenizer.hf_json()
                self._built = LLTokenizer(text, n_vocab=vocab_rows, eos_token=list(eos_ids))
            return self._built


def opens_thinking(prompt_ids: Sequence[int], tokenizer: Any) -> bool:
    """Whether the prompt leaves a `<think>` block open, so the reply starts inside it."""
    start, end = tokenizer.token_to_id(THINK_OPEN), tokenizer.token_to_id(THINK_CLOSE)
    if start is None or end is None:
        return False
    last = {start: -1, end: -1}
    for i, token in enumerate(prompt_ids):
        if token in last:
            last[token] = i
    return last[start] > last[end]


class Constraint:
    """One reply's grammar: masks a step's scores to the tokens it allows next. The reply so
    far (`generated`) is fed to the matcher as it grows, from the token after `</think>`
    where the reply starts in a thinking block."""

    def __init__(self, grammar: str, tokenizer: Any, eos_ids: Sequence[int], think_end: int | None):
        from llguidance import LLMatcher

        self.matcher = LLMatcher(tokenizer, grammar, log_level=0)
        if self.matcher.is_error():  # json_grammar validated it: this is not the request's
            raise RequestRefused(f"the reply's grammar did not compile: {self.matcher.get_error()}")
        self.bitmask = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        self.eos_ids = np.asarray(list(eos_ids), dtype=np.int64)
        self.think_end = think_end  # None: held from the first token
        self.start: int | None = 0 if think_end is None else None  # first held index
        self.fed = 0  # tokens of the held part the matcher has taken
        self.broken = False  # the reply left the grammar (a pick made elsewhere)

    def mask(self, scores: np.ndarray, generated: Sequence[int]) -> None:
        """Set the scores of every token the grammar does not allow next to -inf (in place);
        while the reply is still thinking, leave them."""
        if not isinstance(generated, Sequence):
            generated = list(generated)
        if not self._catch_up(generated):
            return
        allowed = self._allowed(scores.size)
        scores[~allowed] = -np.inf

    def _catch_up(self, generated: Sequence[int]) -> bool:
        """Feed the matcher the held tokens it has not seen; whether the mask applies."""
        if self.broken:
            return False
        if self.start is None:
            try:
                self.start = generated.index(self.think_end) + 1
            except ValueError:
                return False  # still thinking
        held = generated[self.start :]
        for token in held[self.fed :]:
            if not self.matcher.consume_token(int(token)):
                log.warning("a reply left its grammar at token %d; no longer held", token)
                self.broken = True
                return False
        self.fed = len(held)
        return True

    def _allowed(self, size: int) -> np.ndarray:
        """A boolean per score: allowed next. End of sequence where the grammar is complete
        (or has failed), so a reply always has a way to end."""
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        bits = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")
        allowed = np.zeros(size, dtype=bool)
        n = min(size, bits.size)
        allowed[:n] = bits[:n].astype(bool)
        if self.matcher.is_error() or not allowed.any():
            allowed[:] = False
            allowed[self.eos_ids[self.eos_ids < size]] = True
        return allowed
