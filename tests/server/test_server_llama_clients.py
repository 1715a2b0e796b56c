"""llama.cpp's server API as its own web UI, editor plugins and scripts call it, beyond a
plain completion: `/tokenize` with `parse_special`, `/completion` with `n_predict` 0 (the
prompt read into the cache, nothing written) and the token ids of a streamed reply."""

from __future__ import annotations

import httpx

from tests.server.conftest import KEY

AUTH = {"Authorization": f"Bearer {KEY}"}


def post(served, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{served.base}{route}", json=body, headers=AUTH, timeout=60)


def test_tokenize_reads_special_tokens_as_text_where_asked(served):
    """`parse_special: false` (llama.cpp's) reads a special token's text as plain text;
    true, or left out, reads it as the token."""
    tok = served.engine.tokenizer
    text = "say <|im_start|> then <|im_end|>"
    special = {tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")}
    parsed = post(served, "/tokenize", {"content": text}).json()["tokens"]
    assert parsed == tok.encode(text) and special <= set(parsed)
    assert post(served, "/tokenize", {"content": text, "parse_special": True}).json() == {
        "tokens": parsed
    }
    plain = post(served, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert not special & set(plain) and len(plain) > len(parsed)
    assert tok.decode(plain) == text
    pieces = post(served, "/tokenize", {"content": text, "parse_special": False,
                                        "with_pieces": True}).json()["tokens"]  # fmt: skip
    assert [p["id"] for p in pieces] == plain
    assert tok.encode(text) == parsed  # the shared tokenizer still reads them as tokens
    bad = post(served, "/tokenize", {"content": text, "parse_special": "no"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "parse_special"
