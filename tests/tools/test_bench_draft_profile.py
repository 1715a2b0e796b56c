"""tools/bench_draft.py: with --profile, kernel names kept as the table needs them and the
table of a step against the verifies; the table of warm-up's greedy and sampled rounds."""

from __future__ import annotations

from tools.bench_draft import _instance, profile_table


def test_projection_kernels_keep_their_row_count():
    assert _instance("void gemv<0, 4, 1, false, 4>(const void*, ...)") == "gemv<0, 4, 1, false, 4>"
    assert _instance("gemv4<3, false, 2, 1, 0>") == "gemv4<3, false, 2, 1, 0>"
    assert _instance("void gdn_step_keep<4>(const __nv_bfloat16*, ...)") == "gdn_step_keep"
    assert _instance("attn_combine") == "attn_combine"


def test_the_table_orders_by_the_largest_verify_and_totals_each_column():
    prof = {
        "step": {"gemv": {"launches": 10, "us": 100.0}, "attn": {"launches": 2, "us": 5.0}},
        "verify 1": {"gemv": {"launches": 10, "us": 150.0}},
        "verify 3": {
            "gemv": {"launches": 10, "us": 300.0},
            "gdn_step_keep": {"launches": 3, "us": 400.0},
        },
    }
    text = profile_table(prof)
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows[0].startswith("| `gdn_step_keep` | - | - | 400.0 (3) |")
    assert rows[1] == "| `gemv` | 100.0 (10) | 150.0 (10) | 300.0 (10) |"
    assert rows[2] == "| `attn` | 5.0 (2) | - | - |"
    assert text.splitlines()[-1] == "| **all kernels** | **105.0** | **150.0** | **700.0** |"


def test_load_rounds_table_gives_tokens_a_step():
    from tools.bench_draft import load_rounds_table

    rounds = {"greedy": {1: 1.25, 2: 1.5}, "sampled": {1: 2.5, 2: 3.0}}
    text = load_rounds_table(rounds, [0.8])
    # k = 1: 1.8 tokens a round; k = 2: 1 + 0.8 + 0.64 = 2.44
    assert "| 1 | 1.25 | 1.44 | 2.50 | 0.72 |" in text
    assert "| 2 | 1.50 | 1.63 | 3.00 | 0.81 |" in text
