"""`snug` given what a user may type by mistake: a chat command with more after it, a message
the chat template refuses, input in an ASCII-only encoding, a presence penalty far out of
range, an empty --model (engine/cli.py, engine/cli_chat.py, engine/cli_plan.py)."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from engine.cli import main
from engine.cli_chat import _note, chat
from engine.errors import TemplateError


class Asked:
    """An engine that answers every prompt with one word and keeps each message it was
    asked; a message holding BOOM is refused by its chat template."""

    backend_name, context = "numpy", 4096

    def __init__(self) -> None:
        self.asked: list[str] = []

    def chat_ids(self, messages, enable_thinking=None):
        if any("BOOM" in m["content"] for m in messages):
            raise TemplateError("chat_template.jinja: the chat template refused the messages")
        self.asked.append(messages[-1]["content"])
        return [0] * 4

    def generate(self, ids, params, cancel=None):
        stats = SimpleNamespace(new_tokens=3, decode_tok_s=9.0, ttft_s=0.0, prompt_tokens=4)
        yield SimpleNamespace(text="ok", finished=True, finish_reason="stop", stats=stats)


def talk(engine: Asked, *lines: str) -> tuple[int, str]:
    stdin, err = io.StringIO("".join(f"{line}\n" for line in lines)), io.StringIO()
    code = chat(
        engine, "fake", SimpleNamespace(max_new_tokens=8), None, None, stdin, io.StringIO(), err
    )
    return code, err.getvalue()


def test_a_command_with_more_after_it_is_not_sent():
    engine = Asked()
    lines = ("hi", "/reset please", "/retry it", "/continue on", "/exit now", "/help me", "bye")
    code, err = talk(engine, *lines)
    assert code == 0
    assert engine.asked == ["hi", "bye"]  # no command reached the model as a message
    assert "(/reset takes nothing after it: type /reset alone; nothing was sent)" in err
    assert "(/exit takes nothing after it" in err and "(/help takes nothing" in err
    assert "(a new conversation)" not in err


def test_a_message_the_template_refuses_is_reported_and_the_chat_goes_on():
    engine = Asked()
    code, err = talk(engine, "first", "say BOOM", "second")
    assert code == 0
    assert "snug: chat_template.jinja: the chat template refused the messages" in err
    assert engine.asked == ["first", "second"]
    assert err.count("[3 tokens") == 2  # the refused message left the conversation as it was


def test_a_one_token_reply_has_no_rate():
    stats = SimpleNamespace(new_tokens=1, decode_tok_s=0.0, ttft_s=0.0, prompt_tokens=20)
    note = _note(stats, "length", 0, 4096)
    assert note.startswith("1 token · first token") and "tok/s" not in note
    stats = SimpleNamespace(new_tokens=3, decode_tok_s=0.0, ttft_s=0.0, prompt_tokens=20)
    assert "tok/s" not in _note(stats, "length", 0, 4096)  # a rate that was not measured
    stats.thinking_cut = 1
    assert "thinking closed at its budget of 1 token ·" in _note(stats, "length", 0, 4096)


def test_a_reply_that_filled_the_context_says_so_without_passing_it():
    """The last token of a reply is never fed: a reply cut at the context's end counts the
    context's tokens, not one more."""
    stats = SimpleNamespace(new_tokens=11, decode_tok_s=5.0, ttft_s=0.1, prompt_tokens=30)
    assert "40 of 40 tokens of context" in _note(stats, "length", 0, 40)


def test_input_in_ascii_is_read_as_utf8(tiny_checkpoint, monkeypatch, capsys):
    """PYTHONIOENCODING=ascii: a message typed in UTF-8 is read as typed, not refused as
    text that is not UTF-8 (it is)."""
    model = tiny_checkpoint()
    stdin = io.TextIOWrapper(io.BytesIO("café\n".encode()), encoding="ascii")
    monkeypatch.setattr("sys.stdin", stdin)
    args = ["chat", "--model", str(model), "--backend", "numpy", "--max-new-tokens", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "not UTF-8" not in err and "[2 tokens" in err


@pytest.mark.parametrize("value", ["-1e308", "3", "-2.5"])
def test_a_presence_penalty_out_of_range_is_refused_by_its_flag(value, capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--model", "nowhere", "--prompt", "hi", f"--presence-penalty={value}"])
    assert "--presence-penalty: must be from -2 to 2" in capsys.readouterr().err


def test_an_empty_model_is_refused_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # not the folder the command was started in, by accident
    assert main(["info", "--model", ""]) == 2
    assert "snug: CheckpointError: --model is empty" in capsys.readouterr().err


def test_the_card_table_counts_one_token_as_one():
    from engine.cli_plan import _format_card_table

    row = dict(shape="0.8B", format="mlx4", weights_gb=0.42, verdict="fits")
    row |= dict(largest_context=1, largest_context_int8=1, fastest_chunks_context=1)
    assert "at 1 token " in _format_card_table([row], 4 << 30, 1)


def test_a_cache_folder_that_is_a_file_is_named(tmp_path, monkeypatch, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a cache")
    for command in ("info", "clear"):
        assert main(["cache", command, "--dir", str(notes)]) == 2
        assert "notes.txt is a file, not a prompt cache folder; check --dir" in (
            capsys.readouterr().err
        )
    monkeypatch.setenv("SNUG_PROMPT_CACHE_DIR", str(notes))
    assert main(["cache", "clear"]) == 2
    assert "check SNUG_PROMPT_CACHE_DIR" in capsys.readouterr().err
    assert notes.read_text() == "not a cache"
