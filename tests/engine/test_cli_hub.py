"""`--model` given as the repository's address on the Hub, as a browser shows it (or its id
with a slash after it): the download in the Hugging Face cache it names (engine/cli.py)."""

from __future__ import annotations

import json
import shutil

import huggingface_hub.constants
import pytest

from engine.cli import main


@pytest.mark.parametrize(
    "given",
    [
        "https://huggingface.co/mlx-community/Tiny-Qwen3.5",
        "https://huggingface.co/mlx-community/Tiny-Qwen3.5/tree/main",
        "huggingface.co/mlx-community/Tiny-Qwen3.5/",
        "https://hf.co/mlx-community/Tiny-Qwen3.5?library=mlx",
        "mlx-community/Tiny-Qwen3.5/",
    ],
)
def test_a_hub_address_names_the_download_in_the_cache(
    given, tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    revision = "1" * 40
    root = tmp_path / "hub" / "models--mlx-community--Tiny-Qwen3.5"
    shutil.copytree(tiny_checkpoint(), root / "snapshots" / revision)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    assert main(["info", "--model", given, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(root / "snapshots" / revision)


def test_a_hub_address_not_downloaded_names_the_repository(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    assert main(["info", "--model", "https://huggingface.co/org/Not-Here"]) == 2
    err = capsys.readouterr().err
    assert "`hf download org/Not-Here`" in err and "no such folder" not in err
