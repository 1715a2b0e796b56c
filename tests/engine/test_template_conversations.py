"""Conversations as clients send them, rendered by Snug and by transformers with the chat
templates Qwen ships with Qwen3.5: the same text (and ids), or a refusal from both.

The property test draws whole requests (system or developer prompts, content as text or as
text parts, None or missing content, reasoning under its three names, tool calls with
nested arguments as objects or as JSON text, runs of tool results, tool schemas with nested
parameters, thinking on, off or unset, with and without the generation prompt) with text
that looks like the template's own markup. The tests after it pin the shapes it found.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.errors import TemplateError
from engine.testing.tiny import write_tokenizer
from engine.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")


PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
TEMPLATES = {
    "thinking-default": "Qwen3.5-27B.chat_template.jinja",  # 4B, 9B, 27B
    "no-thinking-default": "Qwen3.5-2B.chat_template.jinja",  # 0.8B, 2B
}
EXAMPLES = int(os.environ.get("SNUG_TEMPLATE_EXAMPLES", "150"))
REFUSED = "refused"

# -- strategies -------------------------------------------------------------------------------

MARKUP = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<tool_response>", "</tool_response>", "<function=f>", "<parameter=x>",
    "{{ x }}", "{% if %}", "\n", "\n\n", "  ", "\t", "é", "😀", "東京", "Zürich", "\u200b",
]  # fmt: skip
text = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(MARKUP)), max_size=5).map("".join)
name = st.text(string.ascii_letters + string.digits + "_", min_size=1, max_size=10) | st.just(
    "naïve_名前"
)
parts = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, text),
        st.builds(lambda t: {"text": t}, text),
    ),
    max_size=3,
)
content = st.one_of(
    text,
    text,
    parts,
    st.none(),
    text.map(lambda t: f"<tool_response>{t}</tool_response>"),  # not a query to the template
    st.integers(1, 8000).map(lambda n: "Long text, " * n),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(name, inner, max_size=3),
    max_leaves=8,
)
arg_objects = st.dictionaries(name, json_values, max_size=4)
arguments = st.one_of(
    *[arg_objects] * 9,
    arg_objects.map(lambda a: json.dumps(a, ensure_ascii=False)),  # JSON text: both refuse
    json_values,  # not an object: both refuse, unless it is one
)


@st.composite
def tool_calls(draw: st.DrawFn) -> dict:
    function = {"name": draw(name)}
    if draw(st.integers(0, 5)):
        function["arguments"] = draw(arguments)
    shape = draw(st.sampled_from(["openai", "function-only", "flat"]))
    if shape == "flat":
        return function
    call = {"type": "function", "function": function}
    if shape == "openai":
        call["id"] = "call_" + draw(st.text(string.ascii_letters, max_size=6))
    return call


def _message(role: str, **optional: st.SearchStrategy) -> st.SearchStrategy:
    """A message with `role`; `content` and each of `optional` present or not, None or not."""
    return st.fixed_dictionaries({"role": st.just(role)}, optional={"content": content, **optional})


system = _message("system")
user = _message("user")
reasoning = st.one_of(text, st.none())
assistant = _message(
    "assistant",
    reasoning_content=reasoning,
    reasoning=reasoning,
    thinking=reasoning,
    tool_calls=st.one_of(st.lists(tool_calls(), max_size=3), st.none()),
)
tool = _message("tool", tool_call_id=st.text(string.ascii_letters, max_size=6))
# What the Qwen template refuses: a developer role, a system message after the first.
stray = _message("developer") | system
turns = st.lists(
    st.one_of(user, assistant, st.lists(tool, min_size=1, max_size=3)), max_size=6
).map(lambda items: [m for item in items for m in (item if isinstance(item, list) else [item])])

schema = st.recursive(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
        optional={"description": text, "enum": st.lists(scalars, max_size=3), "default": scalars},
    ),
    lambda inner: st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(name, inner, max_size=3)},
            optional={"required": st.lists(name, max_size=2)},
        ),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)}),
    ),
    max_leaves=6,
)
tool_spec = st.builds(
    lambda n, d, p: {
        "type": "function",
        "function": {"name": n, "description": d, "parameters": p},
    },
    name,
    text,
    schema,
)
tools = st.one_of(
    st.none(),
    st.none(),
    st.lists(tool_spec, max_size=3),
    st.lists(st.one_of(tool_spec, json_values), min_size=1, max_size=2),  # malformed entries
)


@st.composite
def requests(draw: st.DrawFn) -> dict:
    messages = [draw(user), *draw(turns)]
    if draw(st.integers(0, 3)):
        messages = draw(turns) + messages
    if draw(st.booleans()):
        messages = [draw(system), *messages]
    if draw(st.integers(0, 9)) == 5:  # a request the template refuses, now and then
        messages.insert(draw(st.integers(0, len(messages))), draw(stray))
    return {
        "template": draw(st.sampled_from(sorted(TEMPLATES))),
        "messages": messages,
        "add_generation_prompt": draw(st.booleans()),
        "enable_thinking": draw(st.sampled_from([None, True, False])),
        "tools": draw(tools),
    }


# -- rendering --------------------------------------------------------------------------------


def _folder(root: Path, template: str) -> Path:
    """A model folder as Qwen ships one around the tiny tokenizer: config.json and
    tokenizer_config.json of the published shape, the template as chat_template.jinja."""
    write_tokenizer(root)
    shutil.copy(PUBLISHED / "Qwen3.5-4B-MLX-4bit.config.json", root / "config.json")
    config = PUBLISHED / "Qwen3.5-2B-MLX-bf16.tokenizer_config.json"
    shutil.copy(config, root / "tokenizer_config.json")
    (root / "chat_template.jinja").write_text(template, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Tokenizer, object]]:
    out = {}
    for key, file in TEMPLATES.items():
        folder = _folder(tmp_path_factory.mktemp(key), (PUBLISHED / file).read_text("utf-8"))
        out[key] = (Tokenizer.load(folder), transformers.AutoTokenizer.from_pretrained(folder))
    return out


def render_both(pair, messages, prompt=True, thinking=None, tools=None) -> tuple[str, str]:
    """(Snug's rendering, transformers') of one request; REFUSED for a refusal, which from
    Snug must be a TemplateError. Snug must leave the caller's messages and tools as given."""
    snug, hf = pair
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    try:
        want = hf.apply_chat_template(
            copy.deepcopy(messages),
            tools=copy.deepcopy(tools),
            tokenize=False,
            add_generation_prompt=prompt,
            **kwargs,
        )
    except Exception:  # transformers raises TemplateError, TypeError, ValueError, ...
        want = REFUSED
    before = copy.deepcopy((messages, tools))
    try:
        got = snug.apply_chat_template(messages, prompt, thinking, tools)
    except TemplateError:
        got = REFUSED
    assert (messages, tools) == before
    return got, want


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(requests())
def test_requests_render_as_transformers_renders_them(pairs, request_) -> None:
    pair = pairs[request_["template"]]
    got, want = render_both(
        pair,
        request_["messages"],
        request_["add_generation_prompt"],
        request_["enable_thinking"],
        request_["tools"],
    )
    event("refused" if want is REFUSED else "rendered")
    assert got == want
    if got is not REFUSED:
        snug, hf = pair
        assert snug.encode(got) == hf.encode(want, add_special_tokens=False)


# -- shapes the property test found, and their neighbours -------------------------------------

USER = {"role": "user", "content": "Weather in Zürich?"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    "tools",
    [["get_weather"], [None], [WEATHER, 3], [WEATHER, [WEATHER]], {"type": "function"}, "ab", 5],
    ids=["name", "none", "number", "nested-list", "one-spec-unlisted", "text", "int"],
)
def test_tools_that_are_not_specs_are_refused_as_transformers_refuses(pairs, tools) -> None:
    """transformers takes a list of JSON schemas (or functions) and refuses anything else;
    Snug showed `"get_weather"` to the model as a tool, or dropped the tools block."""
    for pair in pairs.values():
        assert render_both(pair, [USER], tools=tools) == (REFUSED, REFUSED)
    snug = pairs["thinking-default"][0]
    with pytest.raises(TemplateError, match=r"tools\b.*function spec"):
        snug.apply_chat_template([USER], tools=tools)


@pytest.mark.parametrize("tools", [[], {}, (WEATHER,)], ids=["empty", "empty-map", "tuple"])
def test_empty_and_tuple_tools_render_as_transformers(pairs, tools) -> None:
    for pair in pairs.values():
        got, want = render_both(pair, [USER], tools=tools)
        assert got == want != REFUSED


@pytest.mark.parametrize("depth", [70, 200, 450])
def test_deeply_nested_arguments_render_as_transformers(pairs, depth) -> None:
    """A tool call's argument nested past 64 levels: transformers renders it (json.dumps
    goes to about 490), Snug refused it as nesting too deep."""
    value: object = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    call = {"type": "function", "function": {"name": "f", "arguments": {"tree": value}}}
    messages = [USER, {"role": "assistant", "content": "", "tool_calls": [call]}]
    got, want = render_both(pairs["thinking-default"], messages, prompt=False)
    assert got == want != REFUSED


@pytest.mark.parametrize("kind", [["text"], {"name": "text"}, 3])
def test_text_part_with_an_odd_type_renders_as_transformers(pairs, kind) -> None:
    """A part whose `type` is a list or an object: Snug's media check raised a bare
    TypeError (unhashable), transformers renders the part's text."""
    messages = [{"role": "user", "content": [{"type": kind, "text": "hi"}]}]
    for pair in pairs.values():
        got, want = render_both(pair, messages)
        assert got == want != REFUSED


def test_long_agent_history_renders_within_the_time_budget(pairs) -> None:
    """400 tool calls, each with a table of 200 rows as its argument: transformers renders
    it in about a second; Snug's size checks walked each call's arguments again at every
    access and spent the 2 s budget before the end."""
    rows = [{"id": i, "tags": ["a", "b"], "ok": i % 2 == 0} for i in range(200)]
    call = {"type": "function", "function": {"name": "store", "arguments": {"rows": rows}}}
    turn = [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool"}]
    messages = [USER, *turn * 400]
    got, want = render_both(pairs["thinking-default"], messages)
    assert got == want != REFUSED
