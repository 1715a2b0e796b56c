"""Chat templates and tokenizer files as fine-tunes of Qwen3.5 ship them, rendered by Snug
exactly as transformers' `apply_chat_template` renders them, or refused with an error that
names the file (or tokenizer_config.json entry) that failed.

Where the template lives varies (chat_template.jinja with additional_chat_templates/,
tokenizer_config.json's `chat_template` as a string, a list or a map of named templates),
as do the special tokens a template reads (tokenizer_config.json, completed by an older
special_tokens_map.json), and the template itself: `{% generation %}` blocks, arguments
given as JSON text, `tojson` options, dated system prompts, text parts joined by filters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.errors import TemplateError, TokenizerError
from engine.testing.tiny import write_tokenizer
from engine.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"
QWEN = (PUBLISHED / "Qwen3.5-27B.chat_template.jinja").read_text(encoding="utf-8")
USER = {"role": "user", "content": "What is the weather in Zürich?"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City, e.g. 'Zürich'"}},
            "required": ["city"],
        },
    },
}
BARE = {"name": "search", "description": "Search", "parameters": {"type": "object"}}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}
TOOL_USE_FILE = "additional_chat_templates/tool_use.jinja"
TOKENS = "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ image_token }}|"


def folder(
    root: Path, template: str | None, config: dict | None = None, tool_use: str = ""
) -> Path:
    """The tiny tokenizer in a model folder: `template` as chat_template.jinja (None: no such
    file), `config` merged into its tokenizer_config.json (a None value drops the key), and
    `tool_use` (when given) as additional_chat_templates/tool_use.jinja."""
    root.mkdir(parents=True, exist_ok=True)
    write_tokenizer(root)
    shutil.copy(PUBLISHED / "Qwen3.5-4B-MLX-4bit.config.json", root / "config.json")
    tok_config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
    for key, value in (config or {}).items():
        if value is None:
            tok_config.pop(key, None)
        else:
            tok_config[key] = value
    (root / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    if template is None:
        (root / "chat_template.jinja").unlink()
    else:
        (root / "chat_template.jinja").write_text(template, encoding="utf-8")
    if tool_use:
        (root / "additional_chat_templates").mkdir()
        (root / TOOL_USE_FILE).write_text(tool_use, encoding="utf-8")
    return root


def both(root: Path, messages: list[dict], prompt: bool = True, **kw) -> tuple[str, str]:
    """(Snug's render, transformers' render) of `messages` in the folder `root`."""
    hf = transformers.AutoTokenizer.from_pretrained(str(root))
    want = hf.apply_chat_template(
        json.loads(json.dumps(messages)), tokenize=False, add_generation_prompt=prompt, **kw
    )
    snug = Tokenizer.load(root)
    got = snug.apply_chat_template(messages, prompt, kw.get("enable_thinking"), kw.get("tools"))
    return got, want


# -- where the templates are -------------------------------------------------------------------

BROKEN = {
    "syntax": ("{% for %}", "line 1: the chat template is not valid Jinja"),
    "raise_exception": ("{{ raise_exception('tools refused') }}", "refused the messages"),
    "unsafe": ("{{ tools.__class__ }}", "outside its sandbox"),
    "type-error": ("{{ tools + 1 }}", "rendering the chat template failed"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_tool_use_template_errors_name_its_own_file(tmp_path, name) -> None:
    """A broken additional_chat_templates/tool_use.jinja is named, not chat_template.jinja
    (which renders the requests without tools, still fine)."""
    text, what = BROKEN[name]
    root = folder(tmp_path, "D:{{ messages[0].content }}", tool_use=text)
    snug = Tokenizer.load(root)
    assert snug.apply_chat_template([USER]) == "D:" + USER["content"]
    with pytest.raises(TemplateError) as err:
        snug.apply_chat_template([USER], True, None, [WEATHER])
    message = str(err.value)
    assert f"{root / TOOL_USE_FILE}: " in message
    assert "chat_template.jinja" not in message.replace("tool_use.jinja", "") and what in message
    assert snug.apply_chat_template([USER]) == "D:" + USER["content"]  # still usable


def test_default_template_errors_name_its_file_beside_a_tool_use_one(tmp_path) -> None:
    root = folder(
        tmp_path,
        "{{ raise_exception('default refused') }}",
        tool_use="{{ raise_exception('tool refused') }}",
    )
    snug = Tokenizer.load(root)
    with pytest.raises(TemplateError, match="tool_use.jinja: .*tool refused"):
        snug.apply_chat_template([USER], True, None, [WEATHER])
    with pytest.raises(TemplateError) as err:
        snug.apply_chat_template([USER])
    assert str(err.value).startswith(f"{root / 'chat_template.jinja'}: ")
    assert "default refused" in str(err.value)


@pytest.mark.parametrize("shape", ["list", "map"])
def test_named_templates_in_tokenizer_config_name_their_entry(tmp_path, shape) -> None:
    named = {"default": "{{ raise_exception('no') }}", "tool_use": "{% if %}"}
    value = [{"name": k, "template": v} for k, v in named.items()] if shape == "list" else named
    snug = Tokenizer.load(folder(tmp_path, None, {"chat_template": value}))
    with pytest.raises(TemplateError, match=r"tokenizer_config\.json \[chat_template 'tool_use'\]"):
        snug.apply_chat_template([USER], True, None, [WEATHER])
    with pytest.raises(TemplateError, match=r"\[chat_template 'default'\]: .*refused.*: no"):
        snug.apply_chat_template([USER])


def test_named_templates_as_a_map_render_as_transformers(tmp_path) -> None:
    """transformers also takes `chat_template` as a map of name to template."""
    value = {"default": "D:" + TOKENS + "{{ messages[0].content }}", "tool_use": "T:{{ tools }}"}
    root = folder(tmp_path, None, {"chat_template": value})
    for kw in ({}, {"tools": [WEATHER]}):
        got, want = both(root, [USER], **kw)
        assert got == want and got[:2] == ("T:" if kw else "D:")


@pytest.mark.parametrize("names", [["tool_use", "rag"], ["rag"]])
def test_named_templates_without_a_default_say_so(tmp_path, names) -> None:
    """transformers refuses a request without tools when no template is named `default`;
    Snug's error names the templates there are and the one missing."""
    value = [{"name": n, "template": f"{n}:{{{{ messages|length }}}}"} for n in names]
    root = folder(tmp_path, None, {"chat_template": value})
    hf = transformers.AutoTokenizer.from_pretrained(str(root))
    with pytest.raises(ValueError, match="no default"):
        hf.apply_chat_template([USER], tokenize=False)
    snug = Tokenizer.load(root)
    with pytest.raises(TokenizerError) as err:
        snug.apply_chat_template([USER])
    message = str(err.value)
    assert "tokenizer_config.json" in message and "'default'" in message
    assert all(repr(n) in message for n in names)
    if "tool_use" in names:
        got, want = both(root, [USER], tools=[WEATHER])
        assert got == want == "tool_use:1"


# -- the special tokens a template reads ----------------------------------------------------------

MAP = {
    "eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False,
                  "rstrip": False, "single_word": False},
    "bos_token": "<|im_start|>",
    "pad_token": None,
    "image_token": "<|im_end|>",
}  # fmt: skip


def test_special_tokens_map_completes_a_tokenizer_config_without_added_tokens(tmp_path) -> None:
    """A tokenizer_config.json as transformers 5 saves it (no `added_tokens_decoder`) beside
    a special_tokens_map.json from an older save: transformers takes the map's tokens (a
    null one removes the token), so the template sees those, and its eos stops too."""
    config = {"added_tokens_decoder": None, "eos_token": "<|im_end|>"}
    root = folder(tmp_path, TOKENS, config)
    (root / "special_tokens_map.json").write_text(json.dumps(MAP), encoding="utf-8")
    got, want = both(root, [USER])
    assert got == want == "<|im_start|>|<|endoftext|>||<|im_end|>|"
    snug = Tokenizer.load(root)
    assert snug.token_to_id("<|endoftext|>") in snug.eos_ids


def test_special_tokens_map_is_ignored_beside_added_tokens_decoder(tmp_path) -> None:
    root = folder(tmp_path, TOKENS, {"eos_token": "<|im_end|>"})
    (root / "special_tokens_map.json").write_text(json.dumps(MAP), encoding="utf-8")
    got, want = both(root, [USER])
    assert got == want == "|<|im_end|>|<|endoftext|>||"


def test_a_broken_special_tokens_map_is_named(tmp_path) -> None:
    root = folder(tmp_path, TOKENS, {"added_tokens_decoder": None})
    (root / "special_tokens_map.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="special_tokens_map.json"):
        Tokenizer.load(root)


# -- fine-tuned templates -------------------------------------------------------------------


def _edit(old: str, new: str) -> str:
    assert old in QWEN, old
    return QWEN.replace(old, new)


ANSWER = "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n' + content }}"  # noqa: E501
# Edits fine-tunes make to Qwen3.5's template (unsloth, assistant-mask training, LM Studio).
VARIANTS = {
    "generation-block": _edit(
        ANSWER,
        "{{- '<|im_start|>' + message.role + '\\n' }}{%- generation %}"
        + ANSWER.replace("'<|im_start|>' + message.role + '\\n", "'")
        + "{%- endgeneration %}",
    ),
    "arguments-as-text": _edit(
        "{%- if tool_call.arguments is defined %}",
        "{%- if tool_call.arguments is string %}{{- tool_call.arguments + '\\n' }}"
        "{%- elif tool_call.arguments is defined %}",
    ),
    "tojson-options": _edit(
        "{{- tool | tojson }}", "{{- tool | tojson(indent=2, separators=(',', ': ')) }}"
    ),
    "dated-system": "{%- set today = strftime_now('%Y') %}{{- bos_token or '' }}"
    + _edit(
        "{{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}",
        "{{- '<|im_start|>system\\n' + (today|length)|string + content + '<|im_end|>\\n' }}",
    ),
    "parts-by-filters": _edit(
        "{%- if content is string %}\n        {{- content }}",
        "{%- if content is string %}\n        {{- content }}\n    {%- elif content is not mapping"
        " and content|selectattr('type', 'defined')|selectattr('type', 'equalto', 'text')|list"
        "|length == content|length %}\n        {{- content|map(attribute='text')|join('') }}",
    ),
    "thinking-by-default-filter": _edit(
        "{%- if enable_thinking is defined and enable_thinking is false %}",
        "{%- if not (enable_thinking|default(true)) %}",
    ),
}
SYSTEM = {"role": "system", "content": " Be brief.\n"}
PARTS = [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]
REPLY = {"role": "assistant", "content": "", "reasoning_content": "Need it.", "tool_calls": [CALL]}
CHATS = {
    "plain": ([USER], {}),
    "thinking-off": ([SYSTEM, USER], {"enable_thinking": False}),
    "parts": ([{"role": "user", "content": PARTS}], {}),
    "history": (
        [
            USER,
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "A2", "reasoning_content": "\nR2\n"},
        ],
        {"add_generation_prompt": False},
    ),
    "tool-round-trip": (
        [
            {"role": "system", "content": "Use tools."},
            USER,
            REPLY,
            {"role": "tool", "content": "21 °C"},
        ],
        {"tools": [WEATHER, BARE], "enable_thinking": True},
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory) -> Path:
    return folder(tmp_path_factory.mktemp(request.param), VARIANTS[request.param])


@pytest.mark.parametrize("chat", sorted(CHATS))
def test_fine_tuned_templates_render_as_transformers(variant, chat) -> None:
    messages, kw = CHATS[chat]
    kw = dict(kw)
    got, want = both(variant, messages, kw.pop("add_generation_prompt", True), **kw)
    assert got == want


# Jinja that templates in the wild use, each as a whole template.
CONSTRUCTS = {
    "loop-neighbours": "{% for m in messages %}{{ loop.previtem.role if not loop.first }}>"
    "{{ loop.nextitem.role if not loop.last }}|{{ loop.length }}{{ loop.revindex }}"
    "{{ loop.cycle('a', 'b') }}{% if loop.changed(m.role) %}*{% endif %}{% endfor %}",
    "filtered-loop": "{% for m in messages if m.role != 'system' %}{{ loop.index }}/"
    "{{ loop.length }}{% endfor %}{% for m in messages|selectattr('role', 'eq', 'user') %}"
    "{{ loop.last }}{% endfor %}",
    "string-methods": "{% set c = messages[1].content %}{{ c.startswith(' ') }}"
    "{{ c.split('l') }}{{ c.strip('\\n') }}{{ c.lstrip() }}{{ c.rstrip() }}"
    "{{ c.replace('l', 'L') }}{{ c.upper() }}{{ c.splitlines() }}{{ 'a:b:c'.rsplit(':', 1) }}",
    "filters": "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}"
    "{{ messages|map(attribute='role')|join(',') }}{{ messages|reverse|map(attribute='role')"
    "|list }}{{ (messages|last).role }}{{ (messages|first).role }}{{ messages[0]|string }}"
    "{{ messages[0]|items|list }}{{ messages[0]|dictsort }}{{ '  a '|trim }}"
    "{{ messages|map(attribute='name', default='anon')|list }}{{ ['a']|map('upper')|list }}",
    "tojson-variants": "{{ messages[0]|tojson(indent=2, ensure_ascii=true) }}"
    "{{ messages[0]|tojson(separators=[',', ':']) }}{{ {'o': messages[1].content}|tojson }}"
    "{{ messages|map('tojson', sort_keys=true)|join }}",
    "namespace-and-macros": "{% set ns = namespace(roles=[], n=0) %}{% for m in messages %}"
    "{% set ns.roles = ns.roles + [m.role] %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    "{{ ns.roles }}{{ ns.n }}{% macro w(x) %}[{{ caller(x) }}]{% endmacro %}"
    "{% call(y) w(1) %}{{ y }}{% endcall %}",
    "generation-scopes": "{% set x = 'out' %}{% for m in messages %}{%- generation -%}"
    "{% set x = 'in' %}{{ m.role }}{{ loop.index }}{%- endgeneration -%}{{ x }}{% endfor %}",
    "tokens-and-thinking": TOKENS + "{{ enable_thinking is defined }}"
    "{{ enable_thinking|default('unset') }}{{ add_generation_prompt }}{{ tools is none }}",
}
CONSTRUCT_MESSAGES = [
    {"role": "system", "content": "sys\n"},
    {"role": "user", "content": "  Hello\n"},
    {"role": "assistant", "content": "Hi", "reasoning_content": "r"},
    {"role": "user", "content": "again"},
]


@pytest.mark.parametrize("name", sorted(CONSTRUCTS))
@pytest.mark.parametrize("thinking", [None, False])
def test_template_constructs_render_as_transformers(tmp_path, name, thinking) -> None:
    kw = {} if thinking is None else {"enable_thinking": thinking}
    got, want = both(folder(tmp_path, CONSTRUCTS[name]), CONSTRUCT_MESSAGES, **kw)
    assert got == want
