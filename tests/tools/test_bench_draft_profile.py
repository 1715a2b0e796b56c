"""tools/bench_draft.py --profile: kernel names kept as the table needs them, and the table
of a step against the verifies."""

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
