"""Token log-probabilities in the OpenAI API's shapes (engine.sampling.token_logprobs gives
them: the model's own distribution, before temperature, penalties or a grammar).

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`,
every token of the reply (its reasoning and tool calls included; not the end-of-sequence
token). Completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, the
alternatives as {token text: logprob}. A token's text is its bytes decoded alone, so a
piece of a character reads as U+FFFD there while `bytes` keeps it exact; its `text_offset`
is where it starts in the reply's text as the reply decodes it (a character's later pieces
start where the character does).
"""

from __future__ import annotations

import codecs
from typing import Any

from engine.sampling import TokenLogprobs
from engine.tokenizer import Tokenizer


class LogprobFormat:
    """Formats one reply's token log-probabilities; for the completions form, decodes the
    reply's bytes as they come (a character's first pieces give no text until its last),
    for the text offset of the next token."""

    def __init__(self, tokenizer: Tokenizer, offset: int = 0) -> None:
        self.tokenizer = tokenizer
        self.offset = offset
        self._bytes: dict[int, bytes] = {}
        self._text = codecs.getincrementaldecoder("utf-8")("replace")

    def _piece(self, token: int) -> tuple[str, bytes]:
        raw = self._bytes.get(token)
        if raw is None:
            raw = self._bytes[token] = self.tokenizer.token_bytes(token)
        return raw.decode("utf-8", errors="replace"), raw

    def _offset(self, raw: bytes) -> int:
        """Where a token of bytes `raw` starts in the text: where the character its first
        byte goes on starts, else after the text so far (an unfinished character the byte
        cannot go on reads as U+FFFD there)."""
        held = self._text.getstate()[0]  # the bytes of an unfinished character
        start = self.offset
        if held and raw:
            try:
                codecs.getincrementaldecoder("utf-8")().decode(held + raw[:1])
            except UnicodeDecodeError:
                start += len(held.decode("utf-8", errors="replace"))
        self.offset += len(self._text.decode(raw))
        return start

    def chat(self, entries: list[tuple[int, TokenLogprobs]]) -> dict[str, Any]:
        content = []
        for token, lp in entries:
            text, raw = self._piece(token)
            top = []
            for alt, alt_lp in lp.top:
                alt_text, alt_raw = self._piece(alt)
                top.append({"token": alt_text, "logprob": alt_lp, "bytes": list(alt_raw)})
            content.append(
                {"token": text, "logprob": lp.logprob, "bytes": list(raw), "top_logprobs": top}
            )
        return {"content": content, "refusal": None}

    def completion(self, entries: list[tuple[int, TokenLogprobs]]) -> dict[str, Any]:
        tokens, values, tops, offsets = [], [], [], []
        for token, lp in entries:
            text, raw = self._piece(token)
            tokens.append(text)
            values.append(lp.logprob)
            top: dict[str, float] = {}
            for alt, alt_lp in lp.top:
                top.setdefault(self._piece(alt)[0], alt_lp)
            tops.append(top)
            if token in self.tokenizer.eos_ids:  # an end token adds no text to the reply
                offsets.append(self.offset)
                continue
            offsets.append(self._offset(raw))
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }
