"""The chat templates Qwen ships with Qwen3.5 (tests/fixtures/published/), rendered by Snug
exactly as transformers' `apply_chat_template` renders them: the same text and the same ids,
for plain chats, thinking on and off, histories with reasoning, tools and tool round trips.
Where transformers would render an image placeholder, Snug refuses the message instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jinja2
import pytest

from engine.errors import TemplateError
from engine.testing.tiny import write_tokenizer
from engine.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
TEMPLATES = {
    "thinking-default": "Qwen3.5-27B.chat_template.jinja",  # 4B, 9B, 27B
    "no-thinking-default": "Qwen3.5-2B.chat_template.jinja",  # 0.8B, 2B
}
CONFIG = PUBLISHED / "Qwen3.5-4B-MLX-4bit.config.json"
TOKENIZER_CONFIG = PUBLISHED / "Qwen3.5-2B-MLX-bf16.tokenizer_config.json"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather — temperature in °C — for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City, e.g. 'Zürich' or \"東京\""},
                "days": {"type": "integer", "minimum": 1},
                "units": {"type": "string", "enum": ["metric", "imperial"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {
        "name": "get_weather",
        "arguments": {"city": "Zürich", "days": 2, "opts": {"unit": "°C", "hours": [6, 12]}},
    },
}
SECOND_CALL = {"type": "function", "function": {"name": "search", "arguments": {"query": "föhn"}}}
USER = {"role": "user", "content": "What is the weather in Zürich? 😀"}

CHATS: dict[str, tuple[list[dict], dict]] = {
    "plain": ([{"role": "user", "content": "Hi there"}], {}),
    "system": ([{"role": "system", "content": "  Be brief.\n"}, USER], {}),
    "thinking-on": ([USER], {"enable_thinking": True}),
    "thinking-off": ([USER], {"enable_thinking": False}),
    "history-with-reasoning": (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1 (dropped)"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "\nA2", "reasoning_content": "\nR2 kept\n"},
        ],
        {"add_generation_prompt": False},
    ),
    "history-then-new-turn": (
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"},
        ],
        {"enable_thinking": True},
    ),
    "reasoning-under-other-names": (
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning": "via reasoning"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2", "thinking": "via thinking"},
        ],
        {"add_generation_prompt": False},
    ),
    "think-tags-in-content": (
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nA1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "<think>\nnew thoughts\n</think>\n\nA2"},
        ],
        {"add_generation_prompt": False},
    ),
    "tools": ([{"role": "system", "content": "Use tools."}, USER], {"tools": [WEATHER, SEARCH]}),
    "tools-without-system": ([USER], {"tools": [WEATHER]}),
    "tool-round-trip": (
        [
            USER,
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "Need data.",
                "tool_calls": [CALL],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "klar"}'},
        ],
        {"tools": [WEATHER]},
    ),
    "parallel-calls-and-answer": (
        [
            {"role": "system", "content": "sys"},
            USER,
            {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL, SECOND_CALL]},
            {"role": "tool", "content": "21 °C"},
            {"role": "tool", "content": "Föhn is a warm wind."},
            {"role": "assistant", "content": "It is 21 °C.", "reasoning_content": "Both back."},
            {"role": "user", "content": "Thanks!"},
        ],
        {"tools": [WEATHER, SEARCH], "enable_thinking": False},
    ),
    "openai-nulls": (
        [
            {"role": "system", "content": "sys", "name": None},
            {"role": "user", "content": "Q", "tool_calls": None},
            {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": None},
            {"role": "tool", "content": "21"},
        ],
        {"tools": [WEATHER]},
    ),
    "text-parts": (
        [
            {
                "role": "system",
                "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}],
            },
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"text": "parts"}]},
        ],
        {},
    ),
}
# Messages the template itself refuses (raise_exception), and a JSON-string argument, which
# the template cannot iterate: both engines fail, Snug with a TemplateError naming the file.
REFUSED = {
    "no-user-query": [{"role": "system", "content": "only a system prompt"}],
    "system-not-first": [USER, {"role": "system", "content": "late"}],
    "unknown-role": [{"role": "narrator", "content": "x"}, USER],
    "arguments-as-json-text": [
        USER,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Bern"}'}}],
        },
    ],
}


def _folder(root: Path, template: str, tokenizer_config: dict | None = None) -> Path:
    """A model folder as Qwen ships one (config.json, tokenizer_config.json of the published
    shape, chat_template.jinja) around the tiny tokenizer."""
    root.mkdir(parents=True, exist_ok=True)
    write_tokenizer(root)
    shutil.copy(CONFIG, root / "config.json")
    config = tokenizer_config or json.loads(TOKENIZER_CONFIG.read_text(encoding="utf-8"))
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (root / "chat_template.jinja").write_text(template, encoding="utf-8")
    return root


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def pair(request, tmp_path_factory) -> tuple[Tokenizer, object]:
    text = (PUBLISHED / TEMPLATES[request.param]).read_text(encoding="utf-8")
    folder = _folder(tmp_path_factory.mktemp(request.param), text)
    return Tokenizer.load(folder), transformers.AutoTokenizer.from_pretrained(str(folder))


def _render(snug: Tokenizer, hf, messages: list[dict], kwargs: dict) -> tuple[str, str]:
    kw = dict(kwargs)
    prompt = kw.pop("add_generation_prompt", True)
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt, **kw)
    got = snug.apply_chat_template(messages, prompt, kw.get("enable_thinking"), kw.get("tools"))
    return got, want


@pytest.mark.parametrize("name", sorted(CHATS))
def test_official_template_renders_as_transformers(pair, name) -> None:
    snug, hf = pair
    messages, kwargs = CHATS[name]
    got, want = _render(snug, hf, messages, kwargs)
    assert got == want
    if kwargs.get("add_generation_prompt", True):
        ids = hf.apply_chat_template(
            messages, tokenize=True, return_dict=False, add_generation_prompt=True, **kwargs
        )
        assert snug.chat_ids(messages, kwargs.get("enable_thinking"), kwargs.get("tools")) == ids


def test_thinking_defaults_differ_by_model_size(tmp_path) -> None:
    """4B/9B/27B think unless told not to; 0.8B/2B do not unless told to."""
    tails = {}
    for key, name in TEMPLATES.items():
        folder = _folder(tmp_path / key, (PUBLISHED / name).read_text(encoding="utf-8"))
        tails[key] = Tokenizer.load(folder).apply_chat_template([USER])
    assert tails["thinking-default"].endswith("<|im_start|>assistant\n<think>\n")
    assert tails["no-thinking-default"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_history_keeps_only_reasoning_after_the_last_query(pair) -> None:
    snug, _ = pair
    text = snug.apply_chat_template(*CHATS["history-with-reasoning"][:1], False)
    assert "R1" not in text and "<think>\nR2 kept\n</think>\n\nA2<|im_end|>" in text
    call = snug.apply_chat_template(*CHATS["tool-round-trip"][:1], True, None, [WEATHER])
    opts = json.dumps(CALL["function"]["arguments"]["opts"], ensure_ascii=False)
    assert f"<parameter=opts>\n{opts}\n</parameter>" in call and "°C" in opts
    assert "<|im_start|>user\n<tool_response>\n" in call


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_template_refusals_are_template_errors(pair, name) -> None:
    snug, hf = pair
    with pytest.raises((jinja2.TemplateError, TypeError)):
        hf.apply_chat_template(REFUSED[name], tokenize=False, add_generation_prompt=True)
    with pytest.raises(TemplateError) as err:
        snug.apply_chat_template(REFUSED[name])
    assert "chat_template.jinja" in str(err.value)


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
MEDIA = {
    "image_url": [{"role": "user", "content": [IMAGE, {"type": "text", "text": "What is it?"}]}],
    "image": [{"role": "user", "content": [{"type": "text", "text": "See"}, {"type": "image"}]}],
    "video": [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}]}],
    "input_audio": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklGR"}}]}
    ],
    "image-in-system": [
        {"role": "system", "content": [{"image": "x.png"}]},
        {"role": "user", "content": "hi"},
    ],
}


@pytest.mark.parametrize("name", sorted(MEDIA))
def test_media_parts_are_refused_politely(pair, name) -> None:
    """transformers renders a vision placeholder the text model cannot fill; Snug says why it
    cannot take the message and which part it is, and keeps working."""
    snug, hf = pair
    messages = MEDIA[name]
    if name in ("image_url", "image"):
        rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert "<|vision_start|><|image_pad|><|vision_end|>" in rendered
    with pytest.raises(TemplateError) as err:
        snug.chat_ids(messages)
    message = str(err.value)
    index = next(i for i, m in enumerate(messages) if not isinstance(m["content"], str))
    part = next(j for j, p in enumerate(messages[index]["content"]) if p.get("type") != "text")
    assert f"messages[{index}].content[{part}]" in message
    assert "text" in message and "image" in message
    assert snug.apply_chat_template([USER]).startswith("<|im_start|>user\n")  # still usable


# --- the environment transformers gives a template --------------------------------------------

ENV_TEMPLATES = {
    "tojson-options": (
        "{{ tools|tojson }}|{{ tools|tojson(indent=2) }}|{{ tools|tojson(ensure_ascii=true) }}"
        "|{{ tools|tojson(sort_keys=true, separators=(',', ':')) }}|{{ tools|tojson(2) }}"
    ),
    "strftime": "{{ strftime_now('%Y') }}|{{ messages[0].content }}",
    "absent-arguments": (
        "{{ tools is none }}{{ tools is defined }}{{ documents is none }}"
        "{{ enable_thinking is defined }}{% for m in messages %}"
        "{{ m.tool_calls is defined }}{{ m.content is defined }}{% endfor %}"
    ),
    "special-tokens": (
        "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}|{{ unk_token is defined }}"
        "|{{ image_token }}|{{ video_token }}|{{ vision_bos_token }}|{{ audio_token }}"
    ),
    "reasoning-aliases": (
        "{% for m in messages %}[{{ m.reasoning_content }}|{{ m.thinking }}]{% endfor %}"
    ),
    "loop-controls": (
        "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}"
        "{{ m.role }}{% if loop.index0 == 2 %}{% break %}{% endif %}{% endfor %}"
        "{% generation %}G{% endgeneration %}"
    ),
}
ENV_MESSAGES = [
    {"role": "user", "content": "Grüße", "tool_calls": None},
    {"role": "assistant", "content": None, "reasoning": "why"},
    {"role": "user", "content": "more"},
    {"role": "assistant", "content": "x", "thinking": "how"},
]


@pytest.mark.parametrize("name", sorted(ENV_TEMPLATES))
@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["no-tools", "tools"])
def test_template_environment_matches_transformers(tmp_path, name, tools) -> None:
    folder = _folder(tmp_path, ENV_TEMPLATES[name])
    snug = Tokenizer.load(folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    got, want = _render(snug, hf, ENV_MESSAGES, {"tools": tools} if tools else {})
    assert got == want


def test_named_tool_use_template_is_chosen_for_tools(tmp_path) -> None:
    """A tokenizer_config.json with named templates: transformers takes `tool_use` for a
    request with tools and `default` otherwise."""
    config = json.loads(TOKENIZER_CONFIG.read_text(encoding="utf-8"))
    config["chat_template"] = [
        {"name": "default", "template": "D:{{ messages[0].content }}"},
        {"name": "tool_use", "template": "T:{{ tools[0].function.name }}"},
    ]
    folder = _folder(tmp_path, "unused", config)
    (folder / "chat_template.jinja").unlink()
    snug = Tokenizer.load(folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for kwargs in ({}, {"tools": [WEATHER]}):
        got, want = _render(snug, hf, [USER], kwargs)
        assert got == want and got[:2] == ("T:" if kwargs else "D:")


# Templates transformers refuses to render: its `namespace` takes no underscore names and its
# `dict` offers only `dict(...)` and `dict.fromkeys` (the builtin type's unbound methods would
# change the caller's messages and tools); an empty chat is refused before any template runs.
ENV_REFUSALS = {
    "namespace-underscore": "{% set ns = namespace(_hidden=1) %}ok",
    "namespace-set-underscore": "{% set ns = namespace(a=1) %}{% set ns._b = 2 %}{{ ns.a }}",
    "dict-update": "{{ dict.update(messages[0].content[0], {'text': 'edited'}) }}ok",
    "dict-clear": "{{ dict.clear(tools[0]) }}{{ tools[0] | length }}",
    "dict-items": "{{ dict.items(messages[0]) | list | length }}",
    "dict-mro": "{{ dict.mro() }}",
}
PART_MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "kept"}]}]


@pytest.mark.parametrize("name", sorted(ENV_REFUSALS))
def test_template_environment_refuses_as_transformers(tmp_path, name) -> None:
    folder = _folder(tmp_path, ENV_REFUSALS[name])
    snug = Tokenizer.load(folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    messages, tools = json.loads(json.dumps([PART_MESSAGES, [WEATHER]]))
    with pytest.raises(jinja2.TemplateError):
        hf.apply_chat_template(messages, tools=tools, tokenize=False)
    with pytest.raises(TemplateError, match="chat_template.jinja"):
        snug.apply_chat_template(messages, False, None, tools)
    assert messages == PART_MESSAGES and tools == [WEATHER]  # the caller's data untouched


def test_template_environment_builds_dicts_as_transformers(tmp_path) -> None:
    template = (
        "{{ dict(a=1, b=[2]) | tojson }}{{ dict([('x', messages[0].role)]) }}"
        "{{ dict.fromkeys(['k', 'l'], 0) }}{% set ns = namespace({'n': 1}, m=2) %}"
        "{% set ns.n = ns.n + ns.m %}{{ ns.n }}"
    )
    folder = _folder(tmp_path, template)
    got, want = _render(Tokenizer.load(folder), hf_tokenizer(folder), [USER], {})
    assert got == want == "{\"a\": 1, \"b\": [2]}{'x': 'user'}{'k': 0, 'l': 0}3"


def test_lipsum_renders_as_in_transformers(tmp_path) -> None:
    """jinja's `lipsum` (random words) is there, as in transformers: same shape of text."""
    template = "{% set t = lipsum(3, false, 5, 9) %}{{ t.split('\\n\\n') | length }}|{{ t[-1] }}"
    folder = _folder(tmp_path, template)
    got, want = _render(Tokenizer.load(folder), hf_tokenizer(folder), [USER], {})
    assert got == want == "3|."


def test_empty_chat_is_refused_as_transformers_refuses(tmp_path) -> None:
    folder = _folder(tmp_path, "{{ messages | length }} messages")
    with pytest.raises(ValueError, match="empty"):
        hf_tokenizer(folder).apply_chat_template([], tokenize=False)
    with pytest.raises(TemplateError, match="empty"):
        Tokenizer.load(folder).apply_chat_template([])


def hf_tokenizer(folder: Path):
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def test_template_environment_has_the_names_transformers_gives(tmp_path) -> None:
    """The same globals, filters and tests (by name) as transformers' template environment."""
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    compile_template = getattr(utils, "_compile_jinja_template", None)
    if compile_template is None:
        pytest.skip("this transformers compiles chat templates elsewhere")
    theirs = compile_template("{{ messages }}").environment
    snug = Tokenizer.load(_folder(tmp_path, "{{ messages }}"))
    ours = snug._get_template().environment
    for table in ("globals", "filters", "tests"):
        assert sorted(getattr(ours, table)) == sorted(getattr(theirs, table)), table
