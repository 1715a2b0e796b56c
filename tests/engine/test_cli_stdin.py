"""`snug generate` with its prompt piped in (`echo hi | snug generate --model DIR`, or
`--prompt -`): read as --prompt would be, and refused by name where it cannot be
(engine/cli.py)."""

from __future__ import annotations

import io
import json

import pytest

from engine.attachments import MAX_FILE_BYTES
from engine.cli import main


def piped(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def reply(model, capsys, *flags: str) -> dict:
    args = ["generate", "--model", str(model), "--backend", "numpy", "--greedy", "--json"]
    assert main([*args, "--max-new-tokens", "2", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_piped_prompt_is_read_as_the_prompt(tiny_checkpoint, monkeypatch, capsys):
    model = tiny_checkpoint()
    given = reply(model, capsys, "--prompt", "Hello there\nsecond line")
    piped(monkeypatch, b"Hello there\nsecond line\n")
    assert reply(model, capsys)["prompt_ids"] == given["prompt_ids"]
    piped(monkeypatch, b"Hello there\nsecond line\n")
    assert reply(model, capsys, "--prompt", "-")["prompt_ids"] == given["prompt_ids"]
    raw = reply(model, capsys, "--prompt", "Hello", "--raw")
    piped(monkeypatch, b"Hello\n")
    assert reply(model, capsys, "--raw")["prompt_ids"] == raw["prompt_ids"]


@pytest.mark.parametrize(
    "data, said",
    [
        (b"caf\xe9\n", "standard input is not UTF-8 text (byte 0xe9 at offset 3)"),
        (b"", "standard input is empty"),
        (b"x" * (MAX_FILE_BYTES + 1), "standard input holds more than"),
    ],
)
def test_a_piped_prompt_that_cannot_be_read_is_refused_before_the_load(
    data, said, tiny_checkpoint, monkeypatch, capsys
):
    piped(monkeypatch, data)
    assert main(["generate", "--model", str(tiny_checkpoint()), "--prompt", "-"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1  # no load: its CPU note would be a line


def test_no_prompt_at_a_terminal_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", Terminal())
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "nowhere"])
    assert exc.value.code == 2
    assert "one of the arguments --prompt --prompt-ids is required" in capsys.readouterr().err
