"""`snug generate` and `snug chat` asked for more than the model or the prompt allows: a
context past the model's own limit, an empty list of token ids (engine/cli.py)."""

from __future__ import annotations

import io
import json

import pytest

from engine.cli import main


def test_a_context_past_the_models_limit_is_said(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint())
    limit = json.loads((tiny_checkpoint() / "config.json").read_text())
    limit = limit.get("text_config", limit)["max_position_embeddings"]
    args = ["generate", "--model", model, "--prompt", "hi", "--backend", "numpy"]
    assert main([*args, "--max-new-tokens", "1", "--context", str(limit * 4)]) == 0
    err = capsys.readouterr().err
    assert (
        f"snug: --context {limit * 4:,} is past the model's limit of {limit:,} tokens "
        f"(max_position_embeddings in {model}/config.json); the context is {limit:,}\n"
    ) in err
    assert main([*args, "--max-new-tokens", "1", "--context", str(limit)]) == 0
    assert "past the model's limit" not in capsys.readouterr().err  # the limit itself: silent


def test_a_chat_says_its_context_was_capped_too(tiny_checkpoint, monkeypatch, capsys):
    model = str(tiny_checkpoint())
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    args = ["chat", "--model", model, "--backend", "numpy", "--max-new-tokens", "1"]
    assert main([*args, "--context", "10000000"]) == 0
    assert "snug: --context 10,000,000 is past the model's limit of" in capsys.readouterr().err


@pytest.mark.parametrize("ids", ["", ",", " , "])
def test_no_token_ids_are_refused_before_the_load(ids, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--model", "nowhere", "--prompt-ids", ids])
    assert exc.value.code == 2
    assert "--prompt-ids: no token ids given" in capsys.readouterr().err
