"""The thinking's markers in a reply, as Qwen3.5 checkpoints write them and as vLLM's `qwen3`
parser (with `qwen3_coder` tool calls) reads them: a `</think>` where no thinking is open
is dropped, not shown as the answer's text; a call Qwen3.5 writes before closing its
thinking ends the thinking and is a call; the same pieces whatever the text's chunks."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server.reply import ReplySplitter

CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>"
)
SCHEMAS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}}}


def split(text, thinking, tools=True, cuts=()):
    """(reasoning, content, calls) from `text` fed in the chunks `cuts` makes of it."""
    splitter = ReplySplitter(thinking, tools, SCHEMAS)
    pieces, at = [], 0
    for cut in [*sorted(set(cuts)), len(text)]:
        pieces += splitter.feed(text[at:cut])
        at = cut
    pieces += splitter.finish()
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind == "content")
    calls = [(p.call.name, json.loads(p.call.arguments)) for p in pieces if p.kind == "tool_call"]
    return reasoning, content, calls


def test_a_stray_close_of_thinking_is_not_the_answers_text():
    # Thinking off: the template closed the block in the prompt; the model closes it again.
    assert split("</think>\n\nHello.", thinking=False) == ("", "Hello.", [])
    assert split("Hello.\n</think>\n\nWorld.", thinking=False) == ("", "Hello.\n\n\nWorld.", [])
    # Thinking on: a second close after the answer began.
    text = "Hmm.\n</think>\n\nHello.</think> World."
    assert split(text, thinking=True) == ("Hmm.", "Hello. World.", [])


def test_an_opening_of_thinking_after_words_is_text_however_it_is_chunked():
    text = "Sure: <think> is the tag."
    for cuts in ((), (2,), (6, 9)):
        assert split(text, thinking=False, tools=False, cuts=cuts) == ("", text, [])
    # First thing in the reply (a template that leaves the block to the model): thinking.
    assert split("<think>\nHmm.\n</think>\n\nHi.", thinking=False) == ("Hmm.", "Hi.", [])


def test_a_call_written_inside_the_thinking_is_a_call():
    """Qwen3.5 may write its call before `</think>` (then closes the thinking after it):
    the call ends the thinking, as vLLM's qwen3 parser ends it there."""
    text = f"I need the weather.\n\n{CALL}\n</think>\n\n"
    want = ("I need the weather.", "", [("get_weather", {"city": "Paris"})])
    for cuts in ((), range(len(text)), (25, 40)):
        assert split(text, thinking=True, cuts=cuts) == want
    # Words after it are the answer's.
    assert split(f"Hmm.\n{CALL}\n</think>\n\nDone.", thinking=True)[1:] == (
        "Done.",
        [("get_weather", {"city": "Paris"})],
    )


def test_the_tag_named_in_the_thinking_is_still_thinking():
    """`<tool_call>` not followed by a function's head (the model writing about the tag)
    stays thinking; so does anything without tools offered."""
    text = "The <tool_call> tag opens a call.\n</think>\n\nHi."
    for cuts in ((), range(len(text))):
        assert split(text, thinking=True, cuts=cuts) == (
            "The <tool_call> tag opens a call.",
            "Hi.",
            [],
        )
    text = f"Plan: {CALL}\n</think>\n\nHi."
    assert split(text, thinking=True, tools=False) == (f"Plan: {CALL}", "Hi.", [])
    # Cut by the token limit while the tag's next words were still coming: thinking.
    assert split("Hmm <tool_call>\n", thinking=True) == ("Hmm <tool_call>", "", [])


FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=get_weather>",
    "</function>", "<parameter=city>", "</parameter>", "\n", "\n\n", " ", "Paris", "é",
    "日本", "<", "</", "1", '{"name": "f", "arguments": {"a": 1}}',
]  # fmt: skip


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.sampled_from(FRAGMENTS), max_size=20),
    st.lists(st.integers(0, 200), max_size=12),
    st.booleans(),
    st.booleans(),
)
def test_any_chunks_give_what_the_whole_text_gives(fragments, cuts, thinking, tools):
    text = "".join(fragments)
    cuts = [c for c in cuts if c <= len(text)]
    whole = split(text, thinking, tools)
    assert split(text, thinking, tools, cuts) == whole
    assert split(text, thinking, tools, range(len(text))) == whole
