"""tools/bench_decode.py's table from a run's results, without a GPU: the step-tuned rate
(what the app runs on a large card) sits beside the per-shape one, each with its share of
the roofline."""

from __future__ import annotations

from tools.bench_decode import table

META = {"gpu": "NVIDIA H200", "commit": "abc1234", "date": "2026-11-30"}


def _row(**extra) -> dict:
    row = {
        "shape": "4B",
        "format": "mlx4",
        "load_s": 0.8,
        "ttft_cold_s": 1.04,
        "decode_tok_s": 625.0,
        "eager_decode_tok_s": 132.0,
        "roofline_pct": 36.6,
        "peak_gb": 3.93,
        "prefill_8192_s": 0.379,
    }
    return row | extra


def test_the_step_tuned_rate_and_its_roofline_share():
    lines = table([_row(decode_tok_s_step_tuned=671.0)], 4242.0, META).splitlines()
    header = [c.strip() for c in lines[2].split("|")]
    cells = [c.strip() for c in lines[4].split("|")]
    assert len(header) == len(cells)
    col = header.index("step-tuned tok/s (the app), % roofline")
    assert cells[col] == "671, 39.3%"  # 36.6% * 671 / 625
    assert cells[header.index("decode tok/s (graph)")] == "625"
    assert cells[header.index("8K s")] == "0.379"


def test_rows_without_it_and_transformers_rows_keep_the_columns():
    hf = {"engine": "transformers", "shape": "4B", "load_s": 3.0, "decode_tok_s": 9.1}
    lines = table([_row(), hf], 4242.0, META).splitlines()
    header = [c.strip() for c in lines[2].split("|")]
    for line in lines[4:6]:
        cells = [c.strip() for c in line.split("|")]
        assert len(cells) == len(header)
        assert cells[header.index("step-tuned tok/s (the app), % roofline")] == "-"
