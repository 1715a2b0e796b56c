"""`snug generate --backend cuda` end to end on the tiny checkpoints, through the CLI."""

from __future__ import annotations

import json
import re

import pytest

from engine.cli import main
from engine.testing.synth import model_dir


def _generate(model: str, backend: str, capsys) -> dict:
    args = ["generate", "--model", model, "--prompt-ids", "5,6,7,8,9", "--max-new-tokens", "16"]
    assert main(args + ["--greedy", "--backend", backend, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fmt", ["mlx4", "bf16"])
def test_generate_on_cuda_matches_numpy(fmt, tmp_path_factory, capsys, monkeypatch):
    """In fp32 the CUDA backend's greedy reply is the numpy backend's, token for token."""
    model = str(model_dir(tmp_path_factory.mktemp("cli"), "tiny", fmt, seed=3))
    monkeypatch.setenv("SNUG_COMPUTE_DTYPE", "float32")
    cuda = _generate(model, "cuda", capsys)
    host = _generate(model, "numpy", capsys)
    assert cuda["backend"] == "cuda" and host["backend"] == "numpy"
    assert len(cuda["output_ids"]) == 16 and cuda["output_ids"] == host["output_ids"]


def test_generate_on_cuda_streams_a_chat_reply(tmp_path_factory, capsys):
    """The default path: bf16 activations, a chat-templated prompt, sampled on the device."""
    model = str(model_dir(tmp_path_factory.mktemp("cli"), "tiny", "mlx4", seed=3))
    args = ["generate", "--model", model, "--prompt", "Hello there", "--max-new-tokens", "12"]
    assert main(args + ["--seed", "3", "--backend", "cuda"]) == 0
    err = capsys.readouterr().err
    counts = re.search(r"\[cuda\] (\d+) prompt tokens, (\d+) new", err)
    assert counts, err
    assert int(counts[1]) > 2 and 1 <= int(counts[2]) <= 12  # a stop token may end it early
