"""`snug plan`: the 4 GiB card table, a checkpoint's headers, no GPU."""

from __future__ import annotations

import json
import struct

from engine.cli_plan import _header_nbytes, card_table, main
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


def test_plan_shape_json(capsys):
    assert main(["plan", "--shape", "2B", "--format", "bf16", "--card-gib", "4", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "does not fit" and data["suggestions"]


def test_header_reader_sums_quantized_parts(tmp_path):
    header = {
        "__metadata__": {"format": "mlx"},
        "language_model.model.embed_tokens.weight": {
            "dtype": "U32",
            "shape": [4, 1],
            "data_offsets": [0, 16],
        },
        "language_model.model.embed_tokens.scales": {
            "dtype": "BF16",
            "shape": [4, 1],
            "data_offsets": [16, 24],
        },
        "language_model.model.embed_tokens.biases": {
            "dtype": "BF16",
            "shape": [4, 1],
            "data_offsets": [24, 32],
        },
        "language_model.model.layers.0.linear_attn.A_log": {
            "dtype": "F32",
            "shape": [2],
            "data_offsets": [32, 40],
        },
        "vision_tower.x.weight": {"dtype": "F32", "shape": [1], "data_offsets": [40, 44]},
    }
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(44))
    assert _header_nbytes(tmp_path) == {"embed_tokens": 32, "layers.0.linear_attn.A_log": 8}


def test_no_gpu_here_is_reported_not_raised(capsys):
    if probe_gpu() is not None:
        assert no_gpu_reason() == ""
        return
    assert no_gpu_reason().startswith("No NVIDIA GPU found")
    assert main(["plan", "--shape", "4B"]) == 2
    assert "--card-gib" in capsys.readouterr().err
