"""Chat and text completions through the official `openai` client: streaming and not,
usage, stop strings, thinking on and off."""

import httpx

from engine.session import GenerationParams

USER = [{"role": "user", "content": "Hello"}]


def answer(text: str) -> str:
    """What the server returns of a reply's text as the answer (leading newlines and
    trailing whitespace are dropped)."""
    return text.lstrip("\n").rstrip()


def test_models_and_health(served):
    client = served.client()
    models = client.models.list().data
    assert [m.id for m in models] == [served.model]
    assert models[0].model_extra["max_model_len"] == served.engine.context
    assert models[0].model_extra["context_length"] == served.engine.context
    health = httpx.get(f"{served.base}/health").json()
    assert health["status"] == "ok" and health["streams"] == 2 and health["queue"] == 6


def test_chat_equals_engine_generate_alone_with_usage(served, solo):
    client = served.client()
    expected = solo(USER, 24, thinking=False)
    reply = client.chat.completions.create(
        model=served.model,
        messages=USER,
        max_tokens=24,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    choice = reply.choices[0]
    assert choice.message.content == answer(expected)
    assert choice.finish_reason == "length"
    assert "reasoning_content" not in (choice.message.model_extra or {})
    prompt_tokens = len(solo.engine.chat_ids(USER, enable_thinking=False))
    assert reply.usage.prompt_tokens == prompt_tokens
    assert reply.usage.completion_tokens == 24
    assert reply.usage.total_tokens == prompt_tokens + 24
    # llama.cpp's `timings` beside the OpenAI fields (its clients read tokens/s there)
    timings = reply.model_extra["timings"]
    assert timings["prompt_n"] == prompt_tokens and timings["predicted_n"] == 24
    assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0
    per_token = timings["predicted_ms"] / (timings["predicted_n"] - 1)
    assert abs(per_token - timings["predicted_per_token_ms"]) < 1e-6 * per_token
    assert "draft_n" not in timings  # this engine does not draft


def test_streaming_gives_the_same_reply_and_usage_last(served, solo):
    client = served.client()
    expected = solo(USER, 24, thinking=False)
    stream = client.chat.completions.create(
        model=served.model,
        messages=USER,
        max_completion_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer(expected)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and set(finals[:-1]) == {None}
    assert not chunks[-1].choices and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])
    # the chunk that ends the reply carries llama.cpp's `timings`, no other does
    timed = [c for c in chunks if "timings" in (c.model_extra or {})]
    assert len(timed) == 1 and timed[0].choices[0].finish_reason == "length"
    assert timed[0].model_extra["timings"]["predicted_n"] == 24


def test_stop_strings_are_cut_from_the_output(served, solo):
    client = served.client()
    full = answer(solo(USER, 40, thinking=False))
    stop = full[12:15]
    cut = full[: full.index(stop)].rstrip()
    thinking_off = {"chat_template_kwargs": {"enable_thinking": False}}
    for stream in (False, True):
        reply = client.chat.completions.create(
            model=served.model,
            messages=USER,
            max_tokens=40,
            temperature=0,
            stop=["never appears", stop],
            stream=stream,
            extra_body=thinking_off,
        )
        if stream:
            chunks = list(reply)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reason = chunks[-1].choices[0].finish_reason
        else:
            text, reason = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert text == cut and stop not in text
        assert reason == "stop"
    served.wait_idle()  # the stopped requests were cancelled and left their slots


def test_thinking_on_returns_the_reply_as_reasoning(served, solo):
    """With thinking on (the template's default here) the reply starts inside <think>: the
    tiny model never closes it, so all of it is reasoning, in both fields."""
    client = served.client()
    expected = solo(USER, 16)
    reply = client.chat.completions.create(
        model=served.model, messages=USER, max_tokens=16, temperature=0
    )
    extra = reply.choices[0].message.model_extra
    assert extra["reasoning_content"] == extra["reasoning"] == answer(expected)
    assert not reply.choices[0].message.content


def test_thinking_is_split_from_the_answer(scripted):
    client = scripted.client()
    scripted.scheduler.say("Two plus two.\nIt is four.\n</think>\n\nFour.")
    on = {"chat_template_kwargs": {"enable_thinking": True}}
    reply = client.chat.completions.create(
        model=scripted.model, messages=USER, max_tokens=50, extra_body=on
    )
    message = reply.choices[0].message
    assert message.content == "Four."
    assert message.model_extra["reasoning_content"] == "Two plus two.\nIt is four."
    assert message.model_extra["reasoning"] == "Two plus two.\nIt is four."
    assert reply.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=scripted.model, messages=USER, max_tokens=50, extra_body=on, stream=True
    )
    reasoning, content = "", ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
    assert (reasoning, content) == ("Two plus two.\nIt is four.", "Four.")
    # Thinking off: the prompt closes the block, so the same text is all answer.
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    scripted.scheduler.say("Just the answer.")
    reply = client.chat.completions.create(
        model=scripted.model, messages=USER, max_tokens=50, extra_body=off
    )
    assert reply.choices[0].message.content == "Just the answer."
    assert "reasoning_content" not in (reply.choices[0].message.model_extra or {})
    prompt = scripted.engine.tokenizer.decode(scripted.scheduler.prompts[-1])
    assert prompt.endswith("<think>\n\n</think>\n\n")
    # OpenAI's reasoning_effort "none" asks the same.
    scripted.scheduler.say("Just the answer.")
    reply = client.chat.completions.create(
        model=scripted.model, messages=USER, max_tokens=50, reasoning_effort="none"
    )
    assert reply.choices[0].message.content == "Just the answer."
    prompt = scripted.engine.tokenizer.decode(scripted.scheduler.prompts[-1])
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_completions_take_text_or_token_ids(served, solo):
    client = served.client()
    ids = solo.engine.tokenizer.encode("The quick brown fox")
    params = GenerationParams(max_new_tokens=10, greedy=True)
    expected = "".join(e.text for e in solo.engine.generate(ids, params))
    by_text = client.completions.create(
        model=served.model, prompt="The quick brown fox", max_tokens=10, temperature=0
    )
    by_ids = client.completions.create(model=served.model, prompt=ids, max_tokens=10, temperature=0)
    assert by_text.choices[0].text == by_ids.choices[0].text == expected
    assert by_ids.usage.prompt_tokens == len(ids) and by_ids.usage.completion_tokens == 10
    stream = client.completions.create(
        model=served.model,
        prompt=ids,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].usage.total_tokens == len(ids) + 10


def test_seeded_sampling_repeats_itself(served):
    client = served.client()
    kwargs = dict(model=served.model, messages=USER, max_tokens=12, temperature=0.9, seed=5)
    kwargs["extra_body"] = {"top_k": 50, "min_p": 0.01, "chat_template_kwargs": {}}
    first = client.chat.completions.create(**kwargs).choices[0].message
    again = client.chat.completions.create(**kwargs).choices[0].message
    assert first.model_extra.get("reasoning") == again.model_extra.get("reasoning")


def test_a_drafting_engine_reports_its_drafts_in_the_timings(tmp_path):
    """Served with MTP drafting on: the reply's `timings` say how many tokens the head
    drafted and how many the model kept, as llama.cpp's server reports its drafts; every
    draft is kept where the drafts are the reply itself."""
    import numpy as np

    from engine.config import EngineSettings
    from engine.scheduler import Scheduler
    from engine.server.app import create_app
    from engine.server.runner import ServerThread
    from engine.session import Engine
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer
    from tests.engine.test_drafting import SHAPE
    from tests.server.conftest import KEY, Served

    path = write_checkpoint(tmp_path / "mtp", SHAPE, "bf16", seed=3, mtp=True)
    write_tokenizer(path)
    ids = np.random.default_rng(1).integers(0, 400, size=24).tolist()
    plain = [e.token_id for e in Engine.load(path, EngineSettings(backend="numpy"), 256)
             .generate(ids, GenerationParams(max_new_tokens=12, greedy=True))]  # fmt: skip
    engine = Engine.load(path, EngineSettings(backend="numpy", draft_tokens="2"), 256)
    engine.drafter.forced = plain
    scheduler = Scheduler(engine).start()
    server = ServerThread(create_app(scheduler, api_key=KEY)).start()
    try:
        client = Served(engine, scheduler, server, path.name).client()
        reply = client.completions.create(model=path.name, prompt=ids, max_tokens=12, temperature=0)
        timings = reply.model_extra["timings"]
        assert timings["predicted_n"] == 12 and timings["draft_n"] > 0
        assert timings["draft_n_accepted"] == timings["draft_n"]
    finally:
        server.stop()
        scheduler.close()


def test_several_system_messages_and_a_late_one_reach_the_template_it_takes(scripted):
    """Qwen3.5's template takes one system message, first: clients that send several (a
    front-end's and the user's; `instructions` and a developer message) get them joined
    into it, and one sent mid-conversation stays in its place as a user turn."""
    client = scripted.client()
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour."},
        {"role": "system", "content": "The user is now away."},
        {"role": "user", "content": "Bye"},
    ]
    scripted.scheduler.say("Au revoir.")
    reply = client.chat.completions.create(model=scripted.model, messages=messages,
                                           extra_body=off)  # fmt: skip
    assert reply.choices[0].message.content == "Au revoir."
    prompt = scripted.scheduler.last_prompt()
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nUse French.<|im_end|>\n")
    assert prompt.count("<|im_start|>system") == 1
    late = "<|im_start|>user\nThe user is now away.<|im_end|>\n<|im_start|>user\nBye<|im_end|>"
    assert "<|im_start|>assistant\nBonjour.<|im_end|>\n" + late in prompt
    # The Responses API's instructions beside a developer message in its input.
    scripted.scheduler.say("Oui.")
    response = client.responses.create(
        model=scripted.model, instructions="Be brief.", reasoning={"effort": "none"},
        input=[{"role": "developer", "content": "Use French."},
               {"role": "user", "content": "Hello"}],
    )  # fmt: skip
    assert response.output_text == "Oui."
    prompt = scripted.scheduler.last_prompt()
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\nUse French.<|im_end|>\n")


def test_the_no_seed_and_no_limit_values_clients_send(scripted):
    """seed -1 (llama.cpp's and Ollama's "none": a fresh draw each time) and max_tokens -1
    (LM Studio's "no limit": the room the context leaves)."""
    scripted.scheduler.say("Fine.")
    body = {"messages": USER, "seed": -1, "max_tokens": -1, "temperature": 0.8}
    headers = {"Authorization": "Bearer test-key"}
    r = httpx.post(f"{scripted.url}/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    body = {"model": scripted.model, "messages": USER, "stream": False,
            "options": {"seed": -1, "num_predict": -1}}  # fmt: skip
    r = httpx.post(f"{scripted.base}/api/chat", json=body, headers=headers, timeout=30)
    assert r.status_code == 200 and r.json()["done_reason"] == "stop", r.text


def test_the_routes_answer_without_v1_too(scripted):
    """A client given the server's bare address appends the route to it (llama.cpp's
    server answers both forms): /models, /chat/completions, /completions, /embeddings."""
    headers = {"Authorization": "Bearer test-key"}
    models = httpx.get(f"{scripted.base}/models", headers=headers, timeout=30)
    assert models.json()["data"][0]["id"] == scripted.model
    scripted.scheduler.say("Fine.")
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    r = httpx.post(f"{scripted.base}/chat/completions", json={"messages": USER, **off},
                   headers=headers, timeout=30)  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Fine."
    scripted.scheduler.say("Yes.")
    r = httpx.post(f"{scripted.base}/completions", json={"prompt": "Hi"}, headers=headers,
                   timeout=30)  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Yes."
    r = httpx.post(f"{scripted.base}/embeddings", json={"input": "Hi"}, headers=headers)
    assert r.status_code == 404 and "embedding" in r.json()["error"]["message"]


def test_usage_counts_the_thinking_tokens(scripted):
    """`completion_tokens_details.reasoning_tokens` (chat) and the Responses API's
    `output_tokens_details`: the reply's tokens up to the one that closes its thinking."""
    text = "Let me see, a few words.</think>\n\nHello!"
    tok = scripted.engine.tokenizer
    script = tok.encode(text)
    thought = next(i for i in range(1, len(script) + 1) if "</think>" in tok.decode(script[:i]))
    assert 1 < thought < len(script)
    client = scripted.client()
    scripted.scheduler.say(text)
    reply = client.chat.completions.create(model=scripted.model, messages=USER)
    assert reply.choices[0].message.content == "Hello!"
    assert reply.usage.completion_tokens_details.reasoning_tokens == thought
    scripted.scheduler.say(text)
    chunks = list(client.chat.completions.create(model=scripted.model, messages=USER,
                  stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == thought
    scripted.scheduler.say(text)
    response = client.responses.create(model=scripted.model, input="Hi")
    assert response.usage.output_tokens_details.reasoning_tokens == thought
    scripted.scheduler.say("Hello!")
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    reply = client.chat.completions.create(model=scripted.model, messages=USER, extra_body=off)
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0


def test_usage_says_how_much_of_the_prompt_came_from_the_cache(served):
    """A conversation that goes on restores its earlier prompt from the engine's prompt
    cache: `prompt_tokens_details.cached_tokens` says how many tokens were not read again,
    and llama.cpp's timings split the prompt into `cache_n` and `prompt_n`."""
    client = served.client()
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    history = [{"role": "user", "content": "Tell me a story about a lighthouse keeper"}]
    ask = {"model": served.model, "max_tokens": 8, "temperature": 0, "extra_body": off}
    first = client.chat.completions.create(messages=history, **ask)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    second = client.chat.completions.create(messages=history, **ask)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    timings = second.model_extra["timings"]
    assert timings["cache_n"] == cached
    assert timings["prompt_n"] == second.usage.prompt_tokens - cached
    response = client.responses.create(model=served.model, input=history, max_output_tokens=8,
                                       reasoning={"effort": "none"})  # fmt: skip
    assert response.usage.input_tokens_details.cached_tokens >= cached


def test_text_parts_in_the_shapes_clients_send(scripted):
    """Text parts typed "text", typed as the Responses API's ("input_text",
    "output_text"), or not typed at all, read as the same message; an image is refused."""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    parts = [{"type": "text", "text": "Hel"}, {"type": "input_text", "text": "lo"},
             {"text": " there"}]  # fmt: skip
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": [{"type": "output_text", "text": "Yes?"}]},
               {"role": "user", "content": parts}]  # fmt: skip
    scripted.scheduler.say("Fine.")
    reply = scripted.client().chat.completions.create(
        model=scripted.model, messages=history, extra_body=off
    )
    assert reply.choices[0].message.content == "Fine."
    prompt = scripted.scheduler.last_prompt()
    assert "assistant\nYes?<|im_end|>" in prompt and "user\nHello there<|im_end|>" in prompt
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    r = httpx.post(f"{scripted.url}/chat/completions", json=body,
                   headers={"Authorization": "Bearer test-key"}, timeout=30)  # fmt: skip
    assert r.status_code == 400 and "image_url" in r.json()["error"]["message"]
