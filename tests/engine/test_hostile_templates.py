"""Chat templates render within time and size budgets; real ones render exactly as before.

The budgets come from engine.template_sandbox, imported inside the tests so that each
finding fails on its own where the sandbox is missing.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import TemplateError
from engine.tokenizer import Tokenizer

MESSAGES = [{"role": "user", "content": "hi"}]


def _tower(name: str, height: int) -> str:
    """Sets `{name}{height}`: a list of two references to a list of two ... (small in
    memory, 2**height leaves when printed or compared)."""
    levels = (f"{{% set {name}{i + 1} = [{name}{i}, {name}{i}] %}}" for i in range(height))
    return f"{{% set {name}0 = [1, 1] %}}" + "".join(levels)


# (template, what the error says). Each ran for minutes or took gigabytes unbounded.
HOSTILE = {
    "nested_range": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "time budget",
    ),
    "local_range": (
        "{% set r = range(100000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}",
        "time budget",
    ),
    "exponential_macro": (
        "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "time budget",
    ),
    "power": ("{{ 10**10000000 }}", "power of over"),
    "indent": ("{{ 'x\\ny'|indent(1000000000) }}", "indent filter"),
    "center": ("{{ 'x'|center(1000000000) }}", "center filter"),
    "str_repeat": ("{{ 'x' * 1000000000 }}", "repeats a value"),
    "list_repeat": ("{{ [1, 2, 3] * 100000000 }}", "repeats a value"),
    "ljust": ("{{ 'x'.ljust(1000000000) }}", "calls ljust"),
    "format_width": ("{{ '{:>1000000000}'.format(1) }}", "formats a string"),
    "percent_width": ("{{ '%1000000000d' % 1 }}", "formats a string"),
    "join": ("{{ range(100000)|join('x' * 1000000) }}", "join filter"),
    "replace": ("{{ ('x' * 1000)|replace('', 'y' * 100000) }}", "replace filter"),
    "batch": ("{{ [1]|batch(1000000000, 0)|list }}", "batch filter"),
    "lipsum": ("{{ lipsum(100000, false, 100, 1000) }}", "asks lipsum for"),
    "lipsum_empty_paragraphs": ("{{ lipsum(10**9, false, -5, 0) }}", "asks lipsum for"),
    "doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s|length }}",
        "builds a value",
    ),
    "tower": (
        "{% set a0 = [1, 1] %}"
        + "".join(f"{{% set a{i + 1} = [a{i}, a{i}] %}}" for i in range(40))
        + "{{ a40 ~ '' }}",
        "builds a value",
    ),
    "tower_filter": (_tower("a", 24) + "{{ a24|trim }}", "builds a value"),
    "tower_test": (_tower("a", 24) + _tower("b", 24) + "{{ a24 is eq b24 }}", "builds a value"),
    "output": ("{% for i in range(1000) %}{{ 'x' * 9000 }}{% endfor %}", "rendered more than"),
    "parentheses": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "nests too deeply"),
    "nested_ifs": ("{% if 1 %}" * 3000 + "x" + "{% endif %}" * 3000, "nests too deeply"),
    "recursive_macro": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nests too deeply"),
}


@pytest.fixture
def tokenizer(tmp_path: Path) -> Tokenizer:
    from engine.testing.tiny import write_tokenizer

    write_tokenizer(tmp_path)
    return Tokenizer.load(tmp_path)


def render(tok: Tokenizer, template: str, **variables) -> str:
    """`template` as the model folder's chat_template.jinja, rendered with `variables`
    (messages and add_generation_prompt by default) through the tokenizer's sandbox."""
    (tok.source.parent / "chat_template.jinja").write_text(template)
    fresh = Tokenizer.load(tok.source.parent)
    fresh.template_limits = tok.template_limits
    variables = {"messages": MESSAGES, "add_generation_prompt": True, **variables}
    return fresh._render(fresh._get_template(), variables)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_stopped_by_name(tokenizer, name):
    from engine.errors import TemplateLimitError
    from engine.template_sandbox import TemplateLimits

    template, what = HOSTILE[name]
    tokenizer.template_limits = TemplateLimits(seconds=0.5)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(TemplateLimitError, match=what) as info:
            render(tokenizer, template)
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert "chat_template.jinja: " in str(info.value) and "was stopped" in str(info.value)
    assert isinstance(info.value, TemplateError)
    assert elapsed < 5 and peak < 400 << 20, (elapsed, peak)


def test_default_budget_stops_an_endless_loop(tokenizer):
    from engine.errors import TemplateLimitError
    from engine.template_sandbox import TemplateLimits

    assert 0.5 <= TemplateLimits().seconds <= 5
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitError, match="time budget"):
        render(tokenizer, HOSTILE["nested_range"][0])
    assert time.perf_counter() - t0 < TemplateLimits().seconds + 3


# A template in Qwen3.5's style, using what the official one uses: macros, namespaces,
# reversed slicing, loop.previtem/nextitem/first/last, |items |tojson |trim |string |length,
# str methods, `~`, `+`, comparisons, `is` tests and raise_exception.
QWEN_STYLE = """\
{%- macro text(content) %}
    {%- if content is string %}{{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}{%- if 'text' in item %}{{- item.text }}{%- endif %}{%- endfor %}
    {%- elif content is none or content is undefined %}{{- '' }}
    {%- else %}{{- raise_exception('Unexpected content type.') }}{%- endif %}
{%- endmacro %}
{%- if tools %}
    {{- '<|im_start|>system\\n# Tools\\n\\n<tools>' }}
    {%- for tool in tools %}{{- '\\n' ~ (tool | tojson) }}{%- endfor %}
    {{- '\\n</tools><|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = text(message.content)|trim %}
        {%- if not(content.startswith('<tool_response>')
                   and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = text(message.content)|trim %}
    {%- if message.role == "system" or message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1] %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and reasoning %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning|trim + '\\n</think>\\n\\n'
                + content }}
        {%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}
        {%- for call in message.tool_calls or [] %}
            {%- set call = call.function if call.function is defined else call %}
            {{- ('\\n\\n' if loop.first and content else '\\n') + '<tool_call>\\n<function=' }}
            {{- call.name + '>\\n' }}
            {%- for name, value in call.arguments|items %}
                {%- set value = value|tojson if value is mapping or (value is sequence and value
                    is not string) else value|string %}
                {{- '<parameter=' + name + '>\\n' + value + '\\n</parameter>\\n' }}
            {%- endfor %}
            {{- '</function>\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != "tool" %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}{{- '<think>\\n' }}{%- endif %}
{%- endif %}
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather for a city, «quoted» 你好",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Weather in Paris? 👋"},
    {
        "role": "assistant",
        "content": "<think>\nneed a tool\n</think>\n\nChecking.",
        "tool_calls": [
            {"function": {"name": "weather", "arguments": {"city": "Paris", "opts": {"u": "C"}}}},
            {"function": {"name": "weather", "arguments": {"city": "Nice", "days": [1, 2]}}},
        ],
    },
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "21 °C, sunny.", "reasoning_content": "from the tool"},
    {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
]


def _tojson(value, indent=None, ensure_ascii=False, **kw):
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, **kw)


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("cut", [2, 3, 6, 7])
def test_real_template_renders_as_the_plain_sandbox_does(tokenizer, thinking, tools, cut):
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    plain.filters["tojson"] = _tojson
    variables = {"messages": CONVERSATION[:cut], "add_generation_prompt": True, "tools": tools}
    if thinking is not None:
        variables["enable_thinking"] = thinking
    want = plain.from_string(QWEN_STYLE).render(**variables)
    assert render(tokenizer, QWEN_STYLE, **variables) == want
    assert "<tool_call>" in want or cut < 3


def test_long_conversation_renders_well_inside_the_budget(tokenizer):
    from engine.template_sandbox import TemplateLimits

    turns = [{"role": ("user", "assistant")[i % 2], "content": "hello " * 80} for i in range(2001)]
    t0 = time.perf_counter()
    out = render(tokenizer, QWEN_STYLE, messages=turns)
    assert out.count("<|im_start|>") == 2002
    assert time.perf_counter() - t0 < TemplateLimits().seconds / 2


@pytest.mark.parametrize("sizes", [[9_000_000], [4_500_000, 4_500_000], [1_000] * 9_000])
def test_a_conversation_too_long_for_the_template_is_named_so(tokenizer, sizes):
    """Messages (or attached files) past the template's output limit: the error says the
    conversation is too long and what to do, not that the template is at fault."""
    from engine.errors import TemplateLimitError

    messages = [{"role": "user", "content": "x" * n} for n in sizes]
    t0 = time.perf_counter()
    with pytest.raises(TemplateLimitError) as info:
        tokenizer.apply_chat_template(messages)
    text = str(info.value)
    assert "conversation and its attached files are too long" in text, text
    assert "8,388,608" in text and "attach fewer or smaller files" in text
    assert "raw prompts" not in text and "replace" not in text
    assert time.perf_counter() - t0 < 10


def test_a_template_that_writes_too_much_is_still_named(tokenizer):
    """A short conversation that a template blows past the limit: the template's fault."""
    from engine.errors import TemplateLimitError

    with pytest.raises(TemplateLimitError, match="replace the template") as info:
        render(tokenizer, HOSTILE["output"][0])
    assert "conversation" not in str(info.value)
