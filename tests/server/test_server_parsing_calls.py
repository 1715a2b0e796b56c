"""Tool calls in Qwen3.5's form as real checkpoints write them, read as vLLM's
`qwen3_coder` parser reads them: calls the real template writes into the history parse
back to the same values (typed by the tool's schema), a value whose `</parameter>` the
model left out ends where the next tag begins, and two functions in one `<tool_call>`
block are two calls; streamed or whole alike."""

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server.reply import ReplySplitter

PUBLISHED = Path(__file__).parents[1] / "fixtures" / "published"
TEMPLATE = (PUBLISHED / "Qwen3.5-27B.chat_template.jinja").read_text()
SCHEMAS = {
    "edit": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "line": {"type": "integer"},
            "text": {"type": "string"},
            "dry": {"type": "boolean"},
        },
    },
    "now": {"type": "object", "properties": {}},
}


def split(text, thinking=False, schemas=SCHEMAS, cuts=()):
    """(reasoning, content, calls) from `text` fed in the chunks `cuts` makes of it; each
    call's streamed argument pieces join into its arguments."""
    splitter = ReplySplitter(thinking, True, schemas)
    pieces, at = [], 0
    for cut in [*sorted(set(cuts)), len(text)]:
        pieces += splitter.feed(text[at:cut])
        at = cut
    pieces += splitter.finish()
    streamed: dict[str, str] = {}
    calls = []
    for p in pieces:
        if p.kind == "call_args":
            streamed[p.call.id] = streamed.get(p.call.id, "") + p.text
        elif p.kind == "tool_call":
            assert streamed.get(p.call.id, p.call.arguments) == p.call.arguments
            calls.append((p.call.name, json.loads(p.call.arguments)))
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind == "content")
    return reasoning, content, calls


def everywhere(text, **kwargs):
    """`split` of the text whole, which every chunking of it must equal."""
    whole = split(text, **kwargs)
    assert split(text, cuts=range(len(text)), **kwargs) == whole
    assert split(text, cuts=range(0, len(text), 7), **kwargs) == whole
    return whole


def test_a_value_without_its_closing_tag_ends_at_the_next_tag():
    """Under long contexts Qwen3.5 sometimes leaves out `</parameter>`: the value ends
    where the next parameter or the function's end begins, not past it."""
    text = (
        "<tool_call>\n<function=edit>\n<parameter=path>\na.py\n<parameter=line>\n3\n"
        "</parameter>\n<parameter=text>\nx = 1\n</function>\n</tool_call>"
    )
    assert everywhere(text) == ("", "", [("edit", {"path": "a.py", "line": 3, "text": "x = 1"})])
    # Such text that is no tag of this call (inside a line, not the tool's parameter, not
    # the function's end before the block's) stays the value's.
    held = "x <parameter=line>\n</function> y\n<parameter=other>\nz\n</function>\n</p>"
    text = f"<tool_call>\n<function=edit>\n<parameter=text>\n{held}\n</parameter>\n"
    text += "</function>\n</tool_call>"
    assert everywhere(text) == ("", "", [("edit", {"text": held})])


def test_two_functions_in_one_block_are_two_calls():
    text = (
        "Both.\n\n<tool_call>\n<function=edit>\n<parameter=path>\na.py\n</parameter>\n"
        "</function>\n<function=now>\n</function>\n</tool_call>"
    )
    assert everywhere(text) == ("", "Both.", [("edit", {"path": "a.py"}), ("now", {})])


def schema_of(value):
    kinds = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string"}
    kind = kinds.get(type(value)) or ("array" if isinstance(value, list) else "object")
    return {"type": kind}


def rendered(args, content):
    """The reply Qwen3.5's published template writes for a call of `f` with `args`."""
    from transformers.utils.chat_template_utils import render_jinja_template

    call = {"type": "function", "function": {"name": "f", "arguments": args}}
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": content, "tool_calls": [call]},
    ]
    (chats,), _ = render_jinja_template([messages], chat_template=TEMPLATE)
    return chats.split("<|im_start|>assistant\n<think>\n", 1)[1].removesuffix("<|im_end|>\n")


WORDS = ["a", " ", "\n", "\n\n", '"', "'", "<", ">", "&", "/", "é", "日本", "😀", "\\", "{}",
         "[1]", "0", "-2.5", "True", "null", "None", "<b>", "</p>", "tool_call"]  # fmt: skip
TEXT = st.lists(st.sampled_from(WORDS), max_size=12).map("".join)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
SCALAR = st.none() | st.booleans() | st.integers(-(10**15), 10**15) | FINITE | TEXT
VALUE = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.dictionaries(st.text("abcxyz_", min_size=1, max_size=5), VALUE, max_size=4),
    st.lists(st.sampled_from(["Let me look.", "\n", " ", "a<b"]), max_size=3).map("".join),
    st.booleans(),
)
def test_what_the_template_writes_reads_back_as_the_same_call(args, content, typed):
    """Strings (raw, newlines and markup kept), numbers, booleans, null, lists and objects
    round-trip with their types where the schema gives them; without a schema every value
    reads as the text the template wrote (vLLM's reading), a string as itself."""
    reply = rendered(args, content)
    schema = {"type": "object", "properties": {k: schema_of(v) for k, v in args.items()}}
    reasoning, said, calls = everywhere(
        reply, thinking=True, schemas={"f": schema if typed else {}}
    )
    assert (reasoning, said) == ("", content.strip())
    ((name, got),) = calls
    assert name == "f" and list(got) == list(args)
    for key, value in args.items():
        if typed:
            assert got[key] == value and type(got[key]) is type(value), key
            assert not isinstance(value, float) or math.copysign(1, value) == math.copysign(
                1, got[key]
            )
        elif isinstance(value, str):
            assert got[key] == value
        else:
            assert isinstance(got[key], str)


TYPED = {
    "flag": {"type": "boolean"},
    "count": {"type": "integer"},
    "size": {"type": "number"},
    "sizes": {"type": "array", "items": {"type": "number"}},
    "note": {"type": ["string", "null"]},
}


def read_value(name, text):
    block = f"<tool_call>\n<function=f>\n<parameter={name}>\n{text}\n</parameter>\n</function>\n"
    _, _, calls = everywhere(block + "</tool_call>", schemas={"f": {"properties": TYPED}})
    ((_, args),) = calls
    return args[name]


def strict(text):
    """JSON as the standard has it (Python's reader also takes NaN and Infinity)."""

    def refuse(word):
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_values_that_do_not_read_as_json_of_their_type_are_read_as_vllm_reads_them():
    """A value written loosely reads as its schema's type where it clearly is one, as
    vLLM's qwen3_coder parser coerces it: booleans in any case and as 1/0, whole numbers
    with a sign or leading zeros, numbers without a leading digit."""
    assert [read_value("flag", t) for t in ("TRUE", "false", "1", "0", "True")] == [
        True, False, True, False, True,
    ]  # fmt: skip
    assert [read_value("count", t) for t in ("05", "+7", "-3", "abc")] == [5, 7, -3, "abc"]
    assert [read_value("size", t) for t in (".5", "2.5", "-1e3", "x")] == [0.5, 2.5, -1000.0, "x"]
    # Where the parameter takes strings too, a text that is no JSON of its other types is
    # the string (the template writes None as None, a string as itself).
    assert [read_value("note", t) for t in ("null", "None", "NULL")] == [None, None, "NULL"]


def test_numbers_past_jsons_range_stay_text_and_the_arguments_stay_json():
    """A number JSON cannot write (1e999 reads as infinity, NaN) would make the arguments
    invalid JSON: such a value is kept as the text the model wrote."""
    for name, text in (("size", "1e999"), ("size", "NaN"), ("size", "-Infinity"),
                       ("sizes", "[1, 1e999]")):  # fmt: skip
        block = f"<tool_call>\n<function=f>\n<parameter={name}>\n{text}\n</parameter>\n"
        splitter = ReplySplitter(False, True, {"f": {"properties": TYPED}})
        pieces = splitter.feed(block + "</function>\n</tool_call>") + splitter.finish()
        (call,) = [p.call for p in pieces if p.kind == "tool_call"]
        assert strict(call.arguments) == {name: text}
