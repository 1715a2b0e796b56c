"""tools/profile_prefill.py's folding of a kernel trace, without a GPU: overlapping kernels
count once in the busy time, gaps show as idle, families add up."""

from __future__ import annotations

from tools.profile_prefill import busy_time, fold, table


def test_overlapping_kernels_count_once_and_gaps_do_not_count():
    assert busy_time([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert busy_time([]) == 0


def test_families_fold_launches_and_time_largest_first():
    kernels = [
        ("void gdn_chunk<64>(float const*)", 0.0, 30.0),
        ("void gdn_chunk<64>(float const*)", 40.0, 30.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 80.0, 50.0),
    ]
    assert fold(kernels) == [("gdn_chunk", 2, 60.0), ("sm90_xmma_gemm_bf16bf16_bf16f32", 1, 50.0)]
    text = table(0.2, kernels)
    assert (
        "some kernel running: 0.1 ms" in text and "no kernel running inside that span: 0.0" in text
    )
    assert "| `gdn_chunk` | 2 | 0.06 | 54.5% |" in text
