import io
import json
import os
import signal
from types import SimpleNamespace

import pytest

from engine.cli import main
from engine.device import probe_gpu
from engine.snapshot_store import LOCK_NAME


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


def test_generate_holds_the_thinking_to_its_budget(tiny_checkpoint, capsys):
    """`--thinking-budget`: the reply's tokens (the closing words among them) in
    output_ids, as many as its stats count; off without thinking."""
    from engine.thinking_budget import CLOSE

    model = str(tiny_checkpoint("untied-l8-r2", "hf-fp32"))
    args = ["generate", "--model", model, "--prompt", "Why?", "--max-new-tokens", "120"]
    args += ["--greedy", "--backend", "numpy", "--json", "--thinking-budget", "5"]
    assert main([*args, "--thinking", "on"]) == 0
    held = json.loads(capsys.readouterr().out)
    if "</think>" in held["text"].split(CLOSE)[0]:
        pytest.skip("the tiny model closed its thinking within the budget")
    assert CLOSE in held["text"] and held["text"].split(CLOSE)[1]
    assert len(held["output_ids"]) == held["timings"]["new_tokens"] == 120
    assert main([*args, "--thinking", "off"]) == 0
    assert CLOSE not in json.loads(capsys.readouterr().out)["text"]


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


class Ticking:
    """An engine that streams a token at a time until its cancel event is set; the third
    token sends this process a SIGINT (Ctrl+C); the last event carries no token."""

    backend_name, vocab_rows, drafting, drafter = "numpy", 100, "", None

    def generate(self, ids, params, cancel=None):
        for i in range(1000):
            if cancel is not None and cancel.is_set():
                break
            if i == 2:
                os.kill(os.getpid(), signal.SIGINT)
            yield SimpleNamespace(token_id=i, text=f"t{i} ", finished=False)
        stats = SimpleNamespace(new_tokens=i, decode_tok_s=1.0, ttft_s=0.0, prompt_tokens=len(ids))
        yield SimpleNamespace(
            token_id=-1, text="", finished=True, finish_reason="cancelled", stats=stats
        )


def test_ctrl_c_stops_a_generate_reply_and_says_so(capsys):
    from engine.cli import _generate, build_parser

    before = signal.getsignal(signal.SIGINT)
    for json_out in (["--json"], []):
        args = build_parser().parse_args(["generate", "--model", "m", "--prompt-ids", "1,2"])
        args.json = bool(json_out)
        assert _generate(Ticking(), args) == 130  # as a shell reports a Ctrl+C
        got = capsys.readouterr()
        assert "snug: stopped (Ctrl+C)" in got.err and "Traceback" not in got.err
        if json_out:
            reply = json.loads(got.out)
            assert reply["finish_reason"] == "cancelled"
            assert 2 <= len(reply["output_ids"]) < 10 and -1 not in reply["output_ids"]
        else:
            assert got.out.startswith("t0 t1 ") and "[numpy] 2 prompt tokens" in got.err
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_while_the_model_loads_exits_quietly(tiny_checkpoint, monkeypatch, capsys):
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("engine.session.Engine.load", interrupted)
    model = str(tiny_checkpoint("tied-l4-r1", "mlx4-g64"))
    assert main(["chat", "--model", model, "--backend", "numpy"]) == 130
    assert capsys.readouterr().err.endswith("snug: interrupted\n")


def test_output_the_terminal_cannot_encode_is_replaced(tiny_checkpoint, tmp_path, monkeypatch):
    """Under a locale that is not UTF-8 (PYTHONIOENCODING=ascii, latin-1, a Windows console)
    a path or a reply it cannot show comes out as '?' instead of a UnicodeEncodeError."""
    import io
    import shutil

    model = tmp_path / "modèle ☃"
    shutil.copytree(tiny_checkpoint("tied-l4-r1", "mlx4-g64"), model)
    raw = io.BytesIO()
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(raw, encoding="ascii"))
    assert main(["info", "--model", str(model)]) == 0
    import sys

    sys.stdout.flush()
    assert raw.getvalue().startswith(str(tmp_path / "mod?le ?").encode() + b"\n")


def test_a_model_path_that_is_no_folder_is_named(tmp_path, capsys):
    assert main(["info", "--model", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert f"--model {tmp_path / 'nowhere'}: there is no such folder" in err
    (tmp_path / "config.json").write_text("{}")
    assert main(["plan", "--model", str(tmp_path / "config.json"), "--card-gib", "4"]) == 2
    err = capsys.readouterr().err
    assert "config.json is a file; give the folder that holds the checkpoint" in err
    assert f"({tmp_path})" in err


def test_a_sampling_flag_out_of_range_is_refused_by_name_before_the_load(
    tiny_checkpoint, monkeypatch, capsys
):
    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("engine.session.Engine.load", no_load)
    model = str(tiny_checkpoint("tied-l4-r1", "mlx4-g64"))
    for command, flag, value in (("generate", "--top-p", "2"), ("chat", "--min-p", "1")):
        extra = ["--prompt", "hi"] if command == "generate" else []
        assert main([command, "--model", model, *extra, flag, value]) == 2
        err = capsys.readouterr().err
        assert f"{flag} {float(value)}: sampling setting out of range" in err


def test_the_drafting_line_comes_only_when_drafting_was_asked(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint("tied-l4-r1", "mlx4-g64"))
    base = ["generate", "--model", model, "--prompt-ids", "1,2", "--backend", "numpy"]
    assert main([*base, "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert "[drafting]" not in err and "tokens/s" not in err  # one token: no decode rate
    assert main([*base, "--draft-tokens", "1"]) == 0
    assert (
        "[drafting] drafting is unavailable: the checkpoint has no mtp" in capsys.readouterr().err
    )


@pytest.mark.skipif(probe_gpu() is not None, reason="an NVIDIA GPU is present")
def test_without_a_gpu_the_cpu_backend_says_why(tiny_checkpoint, monkeypatch, capsys):
    monkeypatch.delenv("SNUG_BACKEND", raising=False)
    model = str(tiny_checkpoint("tied-l4-r1", "mlx4-g64"))
    base = ["generate", "--model", model, "--prompt-ids", "1", "--max-new-tokens", "1"]
    assert main(base) == 0
    err = capsys.readouterr().err
    assert "snug: running on the CPU (numpy), far slower than a GPU: No NVIDIA GPU" in err
    assert main([*base, "--backend", "numpy"]) == 0  # asked for: nothing to explain
    err = capsys.readouterr().err
    assert "running on the CPU" not in err
    assert "] 1 prompt token, 1 new;" in err  # one token is one, not "1 prompt tokens"


def test_plan_refuses_counts_out_of_range_by_flag(capsys):
    for flag, value, least in (
        ("--max-rows", "0", 1),
        ("--context", "-5", 1),
        ("--streams", "0", 1),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["plan", "--shape", "4B", "--card-gib", "4", flag, value])
        assert exit_info.value.code == 2
        assert f"argument {flag}: must be >= {least}, got {value}" in capsys.readouterr().err


def test_cache_clear_leaves_a_folder_that_is_no_prompt_cache(
    tiny_checkpoint, tmp_path, monkeypatch, capsys
):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("tied-l4-r1", "mlx4-g64"), model)
    files = sorted(p.name for p in model.iterdir())
    assert main(["cache", "clear", "--dir", str(model)]) == 2
    err = capsys.readouterr().err
    assert f"{model} is not a prompt cache folder: it holds config.json" in err
    assert "nothing was removed. Check --dir" in err
    monkeypatch.setenv("SNUG_PROMPT_CACHE_DIR", str(model))
    assert main(["cache", "clear"]) == 2
    assert "Check SNUG_PROMPT_CACHE_DIR" in capsys.readouterr().err
    assert sorted(p.name for p in model.iterdir()) == files  # the model is whole
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"{model}: 0 saved prompt states" in out and "which are no saved prompt states" in out


def test_cache_reads_a_folder_named_with_a_tilde_as_the_engine_does(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "states").mkdir()
    state = tmp_path / "states" / ("0123456789abcdef" * 2)
    state.with_suffix(".json").write_text('{"engine": "0.1.0", "precision": "numpy:float32"}')
    state.with_suffix(".safetensors").write_bytes(bytes(2048))
    monkeypatch.setenv("SNUG_PROMPT_CACHE_DIR", "~/states")
    assert main(["cache", "info"]) == 0
    assert f"{tmp_path / 'states'}: 1 saved prompt states" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 saved prompt states" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "states").iterdir()] == [LOCK_NAME]  # engines share it


def test_a_misspelled_flag_is_refused_with_the_commands_own_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", "m", "--prompt", "hi", "--max-tokens", "5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: snug generate" in err and "--max-new-tokens" in err
    assert err.endswith("snug generate: error: unrecognized arguments: --max-tokens 5\n")


def test_unset_sampling_flags_take_the_model_cards_values_for_the_mode(
    tiny_checkpoint, monkeypatch, capsys
):
    """Qwen3.5's model cards recommend one sampling where the reply thinks first and one
    where it does not: `snug generate` and `snug chat` take the set for the reply's mode
    wherever a flag does not say otherwise."""
    from engine.session import Engine

    seen = []
    real = Engine.generate

    def spy(self, prompt_ids, params, *args, **kwargs):
        seen.append(params)
        return real(self, prompt_ids, params, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy)
    model = str(tiny_checkpoint("untied-l8-r2", "hf-fp32"))
    args = ["generate", "--model", model, "--prompt", "Why?", "--max-new-tokens", "2"]
    args += ["--backend", "numpy", "--json"]

    def knobs(params):
        return (params.temperature, params.top_p, params.top_k, params.presence_penalty)

    assert main([*args, "--thinking", "on"]) == 0
    assert knobs(seen[-1]) == (1.0, 0.95, 20, 1.5)
    assert main([*args, "--thinking", "off"]) == 0
    assert knobs(seen[-1]) == (0.7, 0.8, 20, 1.5)
    assert main([*args, "--thinking", "on", "--temperature", "0.3", "--top-k", "5"]) == 0
    assert knobs(seen[-1]) == (0.3, 0.95, 5, 1.5)
    assert main([*args, "--greedy"]) == 0  # the plain argmax: no penalty unless asked
    assert seen[-1].is_greedy and seen[-1].presence_penalty == 0.0
    assert main([*args, "--temperature", "0", "--presence-penalty", "0.5"]) == 0
    assert seen[-1].is_greedy and seen[-1].presence_penalty == 0.5
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\n"))
    chat = ["chat", "--model", model, "--backend", "numpy", "--max-new-tokens", "2"]
    assert main([*chat, "--thinking", "on"]) == 0
    assert knobs(seen[-1]) == (1.0, 0.95, 20, 1.5)
