"""`snug plan`: the 4 GiB card table, a checkpoint's headers, no GPU."""

from __future__ import annotations

import json

import pytest

from engine.cli_plan import card_table, main, model_specs
from engine.config import GIB, EngineSettings
from engine.device import no_gpu_reason, probe_gpu


def test_four_gib_table_has_a_verdict_for_every_shape(capsys):
    rows = card_table(4 * GIB, 4 * GIB, EngineSettings())
    assert len(rows) == 8 and all(r["verdict"] for r in rows)
    by = {(r["shape"], r["format"]): r for r in rows}
    assert by[("4B", "mlx4")]["largest_context"] >= 4096
    assert by[("9B", "bf16")]["verdict"] == "does not fit"
    assert by[("9B", "bf16")]["largest_context"] == 0
    assert main(["plan", "--shape", "all", "--card-gib", "4"]) == 0
    out = capsys.readouterr().out
    assert "4B     mlx4" in out and out.count("\n") >= 9


def test_a_context_that_fits_is_never_past_the_largest():
    """At 3 GiB the 4B fits 4,096 tokens only in lazy chunks: the largest context says so,
    and the fastest chunks' context is the shorter one a load without a context takes."""
    for row in card_table(3 * GIB, 3 * GIB, EngineSettings()):
        if row["verdict"] != "does not fit":
            assert row["largest_context"] >= 4096, row
            assert row["largest_context"] >= row["fastest_chunks_context"] > 0, row
    four = next(r for r in card_table(3 * GIB, 3 * GIB, EngineSettings()) if r["shape"] == "4B")
    assert four["fastest_chunks_context"] < 4096 <= four["largest_context"]


def test_plan_shape_json(capsys):
    assert main(["plan", "--shape", "2B", "--format", "bf16", "--card-gib", "4", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "does not fit" and data["suggestions"]


def test_plan_a_checkpoint_from_its_headers(tiny_checkpoint, capsys):
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    config, specs = model_specs(model)
    table = specs["embed_tokens"]
    assert config.quantized and table.shape == (512, 128) and table.quant.bits == 4
    assert main(["plan", "--model", str(model), "--card-gib", "4", "--json"]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["verdict"] == "fits" and decision["breakdown"]["weights"] > 0


def test_no_gpu_here_is_reported_not_raised(capsys):
    if probe_gpu() is not None:
        assert no_gpu_reason() == ""
        return
    assert no_gpu_reason().startswith("No NVIDIA GPU found")
    assert main(["plan", "--shape", "4B"]) == 2
    assert "--card-gib" in capsys.readouterr().err


def test_readme_table_is_what_snug_plan_prints(capsys):
    """The README's 4 GiB table is `snug plan --shape all --card-gib 4`, row for row."""
    from pathlib import Path

    readme = (Path(__file__).parents[3] / "README.md").read_text()
    assert main(["plan", "--shape", "all", "--card-gib", "4"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[1:]  # below the card line
    for line in printed:
        assert f"    {line}\n" in readme, line


def test_small_card_plan_keeps_large_chunks_and_predicts_speed(capsys):
    """The 4B MLX 4-bit at 16K on a 4 GiB card: 512-row chunks (the saved state moves to
    host memory instead), and a predicted first-token time and decode rate."""
    argv = ["plan", "--shape", "4B", "--format", "mlx4", "--card-gib", "4", "--context", "16384"]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["max_rows"] >= 256 and data["prompt_cache_on_host"]
    assert data["prediction"]["ttft_s"] > 0 and data["prediction"]["decode_tok_s"] > 0
    assert main(argv) == 0
    assert "to the first token" in capsys.readouterr().out


def test_gib_flags_out_of_range_are_refused_by_name(capsys):
    """Sizes no float holds in bytes (or NaN) stop at the flag, named, not as an
    OverflowError or ValueError from the plan."""
    for flag, value, says in (
        ("--card-gib", "1e300", "must be at most 1,048,576 GiB"),
        ("--card-gib", "nan", "must be a finite number"),
        ("--limit-gib", "2e299", "must be at most 1,048,576 GiB"),
        ("--reserve-gib", "-1", "must be >= 0"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["plan", "--shape", "4B", flag, value])
        assert exit_.value.code == 2
        assert f"argument {flag}: {says}" in capsys.readouterr().err
