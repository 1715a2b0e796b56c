"""The utility routes vLLM's and llama.cpp's servers answer: a prompt or a chat as tokens
(counted as the chat route counts its prompt), tokens back as text, and the prompt a chat
renders to."""

from __future__ import annotations

import httpx

from tests.server.conftest import KEY, WEATHER_PARAMETERS

AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Paris? ☀️"},
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city",
                     "parameters": WEATHER_PARAMETERS},
    }
]  # fmt: skip


def post(served, route: str, body: dict, root: bool = True) -> httpx.Response:
    base = served.base if root else served.url
    return httpx.post(f"{base}{route}", json=body, headers=AUTH, timeout=30)


def test_a_chat_counts_as_the_chat_route_counts_its_prompt(served):
    for tools in (None, TOOLS):
        extra = {"tools": tools} if tools else {}
        got = post(served, "/tokenize", {"model": served.model, "messages": CHAT, **extra})
        assert got.status_code == 200, got.text
        body = got.json()
        reply = served.client().chat.completions.create(
            model=served.model, messages=CHAT, max_tokens=1, **extra
        )
        assert body["count"] == len(body["tokens"]) == reply.usage.prompt_tokens
        assert body["max_model_len"] == served.engine.context and body["token_strs"] is None
        assert body["tokens"] == served.engine.tokenizer.encode(
            served.engine.tokenizer.apply_chat_template(CHAT, True, None, tools)
        )
    bare = post(served, "/v1/tokenize", {"messages": CHAT, "add_generation_prompt": False})
    assert bare.status_code == 200 and bare.json()["count"] < body["count"]
    template = post(served, "/apply-template", {"messages": CHAT}).json()["prompt"]
    assert template == served.engine.tokenizer.apply_chat_template(CHAT, True, None, None)
    assert "<|im_start|>assistant\n" in template and "Be brief." in template
    served.wait_idle()


def test_a_prompt_and_its_tokens_go_both_ways(served):
    text = "Snug runs <|im_start|> on small cards: naïve café ☀️"
    tok = served.engine.tokenizer
    got = post(served, "/tokenize", {"prompt": text, "return_token_strs": True}).json()
    assert got["tokens"] == tok.encode(text) and got["count"] == len(got["tokens"])
    assert got["token_strs"] == [tok.id_to_token(t) for t in got["tokens"]]
    assert tok.token_to_id("<|im_start|>") in got["tokens"]  # read as the special token
    back = post(served, "/detokenize", {"tokens": got["tokens"]}).json()
    assert back["prompt"] == back["content"] == text
    # llama.cpp's shape: `content`, and each token's piece (bytes where not whole UTF-8)
    plain = post(served, "/tokenize", {"content": text}).json()
    assert plain == {"tokens": got["tokens"]}
    pieces = post(served, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == got["tokens"]
    joined = b"".join(
        bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces
    )
    assert joined.decode() == text


def test_bad_requests_are_refused_by_name(served):
    vocab = served.engine.vocab_rows
    for body, name in (
        ({"tokens": [1, vocab]}, "tokens"),
        ({"tokens": "12"}, "tokens"),
        ({"tokens": [True]}, "tokens"),
    ):
        got = post(served, "/detokenize", body)
        assert got.status_code == 400 and got.json()["error"]["param"] == name
    got = post(served, "/tokenize", {"text": "hi"})
    assert got.status_code == 400 and "'prompt' or 'messages'" in got.json()["error"]["message"]
    got = post(served, "/tokenize", {"model": "other", "prompt": "hi"})
    assert got.status_code == 404 and got.json()["error"]["code"] == "model_not_found"
    unauthorized = httpx.post(f"{served.base}/tokenize", json={"prompt": "hi"}, timeout=30)
    assert unauthorized.status_code == 401
