import json

import pytest

from engine.cli import main
from engine.device import probe_gpu


def test_generate_json_is_deterministic_and_greedy(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint("untied-l8-r2", "mlx4-g64"))
    args = [
        "generate",
        "--model",
        model,
        "--prompt-ids",
        "5,6,7,8",
        "--max-new-tokens",
        "6",
        "--greedy",
        "--backend",
        "numpy",
        "--json",
    ]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["prompt_ids"] == [5, 6, 7, 8]
    assert len(first["output_ids"]) == 6 and first["output_ids"] == second["output_ids"]
    assert first["backend"] == "numpy" and first["timings"]["new_tokens"] == 6


def test_generate_streams_text_with_chat_template(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint("untied-l8-r2", "hf-fp32"))
    assert (
        main(
            [
                "generate",
                "--model",
                model,
                "--prompt",
                "Hello there",
                "--max-new-tokens",
                "5",
                "--seed",
                "3",
                "--backend",
                "numpy",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "[numpy]" in err and "5 new" in err


def test_info_lists_tensors(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint("tied-l4-r1", "mlx4-g32"))
    assert main(["info", "--model", model, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "mlx" and info["quantization"] == {"bits": 4, "group_size": 32}
    assert info["tensors"]["embed_tokens"]["dtype"] == "q4"


def test_missing_model_is_a_clear_error(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "ConfigError" in err and "config.json not found" in err


@pytest.mark.skipif(probe_gpu() is not None, reason="an NVIDIA GPU is present")
def test_cuda_backend_without_gpu_says_so(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint("tied-l4-r1", "hf-fp32"))
    assert main(["generate", "--model", model, "--prompt-ids", "1", "--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "BackendUnavailable" in err and "No NVIDIA GPU" in err


def _cached(hub, repo: str, folder) -> str:
    """`folder` as the Hugging Face cache holds a download of `repo` (a snapshot of copies)."""
    import shutil

    revision = "1" * 40
    root = hub / ("models--" + repo.replace("/", "--"))
    shutil.copytree(folder, root / "snapshots" / revision)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(revision)
    return str(root / "snapshots" / revision)


def test_a_repository_id_names_its_download_in_the_cache(tiny_checkpoint, tmp_path, capsys):
    import huggingface_hub.constants

    from engine.checkpoint.checkpoint import find_model, model_name

    hub = tmp_path / "hub"
    snapshot = _cached(hub, "mlx-community/Tiny-Qwen3.5", tiny_checkpoint("tied-l4-r1", "mlx4-g32"))
    assert str(find_model("mlx-community/Tiny-Qwen3.5", str(hub))) == snapshot
    assert model_name(snapshot) == "Tiny-Qwen3.5"
    assert str(find_model(snapshot, str(hub))) == snapshot  # a folder is itself
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
        assert main(["info", "--model", "mlx-community/Tiny-Qwen3.5", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["format"] == "mlx"
        assert main(["info", "--model", "mlx-community/Not-Downloaded"]) == 2
    err = capsys.readouterr().err
    assert "CheckpointError" in err and "hf download mlx-community/Not-Downloaded" in err


def test_generate_reads_attached_files_before_the_prompt(tiny_checkpoint, tmp_path, capsys):
    from engine.attachments import compose, read_attachment
    from engine.tokenizer import Tokenizer

    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    notes = tmp_path / "notes.md"
    notes.write_text("alpha\nbeta\n", encoding="utf-8")
    flags = ["--max-new-tokens", "1", "--greedy", "--backend", "numpy", "--json"]
    args = ["generate", "--model", str(model), "--prompt", "Hi", "--attach", str(notes), *flags]
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)["prompt_ids"]
    message = compose("Hi", [read_attachment(notes)])
    want = Tokenizer.load(model).chat_ids([{"role": "user", "content": message}])
    assert got == list(want) and "File: notes.md\n```markdown\nalpha" in message
    (tmp_path / "cat.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(16))
    args[-len(flags) - 1] = str(tmp_path / "cat.png")
    assert main(args) == 2
    assert "snug: AttachmentRefused: cat.png is a PNG image, not text" in capsys.readouterr().err
    assert main([*args[:5], "--raw", "--attach", str(notes), *flags]) == 2
    assert "--attach goes with --prompt" in capsys.readouterr().err
