"""tools/bench_handoff.py's host side: the reference its device runs are checked against,
and its table (the device runs themselves need a GPU)."""

from __future__ import annotations

import numpy as np

from tools.bench_handoff import reference, table


def test_each_stage_normalises_then_adds_the_index_pattern():
    x = np.full(16, 3.0, np.float32)
    one = reference(x, 1)
    assert np.allclose(one, 1.0 + 1e-3 * (np.arange(16) & 7), rtol=1e-6)
    many = reference(np.random.default_rng(1).standard_normal(2560).astype(np.float32), 64)
    assert many.dtype == np.float32 and np.isfinite(many).all()
    assert abs(float(np.sqrt((many.astype(np.float64) ** 2).mean())) - 1.0) < 0.01


def test_the_table_has_a_row_a_grid_and_word_count_and_a_dash_where_a_way_did_not_run():
    results = {
        (132, 0, 1): {
            "pdl": {"us_per_stage": 3.21, "rel_err": 0.0},
            "persistent": {"us_per_stage": 1.5, "staging_us": 0.61},
        },
        (132, 8, 1): {"bulk": {"us_per_stage": 2.5, "staging_us": 0.84}},
        (64, 0, 1): {"plain": {"us_per_stage": 4.0}},
    }
    text = table(results, 64, 2560)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert rows == [
        "| 64 | 0 | 1 | - | - | 4.00 | - | - | - | - | - | - |",
        "| 132 | 0 | 1 | 3.21 | - | - | 1.50 | - | - | - | 0.61 | - |",
        "| 132 | 8 | 1 | - | 2.50 | - | - | - | - | 0.84 | - | - |",
    ]
    assert "staging, persistent |" in text
    assert "64 stages of 2560 floats" in text


def test_each_ahead_way_that_ran_gets_a_time_and_a_staging_column_in_its_order():
    results = {
        (132, 8, 1): {
            "persistent": {"us_per_stage": 3.9, "staging_us": 0.37},
            "ahead 2": {"us_per_stage": 2.1, "staging_us": 0.4},
            "ahead 1": {"us_per_stage": 2.6, "staging_us": 0.5},
        },
        (132, 0, 1): {"persistent": {"us_per_stage": 1.6, "staging_us": 0.36}},
    }
    text = table(results, 64, 1024)
    header = next(line for line in text.splitlines() if line.startswith("| blocks"))
    assert header.endswith("| staging, ahead 1 | staging, ahead 2 |")
    assert "| pdl-smem | ahead 1 | ahead 2 |" in header
    rows = [line for line in text.splitlines() if line.startswith("| 132")]
    assert rows == [
        "| 132 | 0 | 1 | - | - | - | 1.60 | - | - | - | - | - | 0.36 | - | - | - |",
        "| 132 | 8 | 1 | - | - | - | 3.90 | - | 2.60 | 2.10 | - | - | 0.37 | - | 0.50 | 0.40 |",
    ]
