"""Token log-probabilities in the OpenAI API's shapes (engine.sampling.token_logprobs gives
them: the model's own distribution, before temperature, penalties or a grammar).

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`,
every token of the reply (its reasoning and tool calls included; not the end-of-sequence
token). Completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, the
alternatives as {token text: logprob}. A token's text is its bytes decoded alone, so a
piece of a character reads as U+FFFD there while `bytes` keeps it exact.
"""

from __future__ import annotations

from typing import Any

from engine.sampling import TokenLogprobs
from engine.tokenizer import Tokenizer


class LogprobFormat:
    """Formats one reply's token log-probabilities; remembers the text offset of the next
    token for the completions form."""

    def __init__(self, tokenizer: Tokenizer, offset: int = 0) -> None:
        self.tokenizer = tokenizer
        self.offset = offset
        self._bytes: dict[int, bytes] = {}

    def _piece(self, token: int) -> tuple[str, bytes]:
        raw = self._bytes.get(token)
        if raw is None:
            raw = self._bytes[token] = self.tokenizer.token_bytes(token)
        return raw.decode("utf-8", errors="replace"), raw

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
            text, _ = self._piece(token)
            tokens.append(text)
            values.append(lp.logprob)
            top: dict[str, float] = {}
            for alt, alt_lp in lp.top:
                top.setdefault(self._piece(alt)[0], alt_lp)
            tops.append(top)
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }
