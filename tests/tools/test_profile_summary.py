"""tools/profile_step.py folds Nsight Compute's CSV into a table of kernel families, with
memory columns where the CSV has the memory metrics (no GPU needed to check the folding)."""

from __future__ import annotations

import csv

from tools.profile_step import step_shares, summary

COLS = ["ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"]


def _csv(tmp_path, rows) -> str:
    path = tmp_path / "ncu.csv"
    with open(path, "w", newline="") as f:
        f.write("==PROF== a line ncu prints that is not CSV\n")
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(COLS)
        w.writerows(rows)
    return str(path)


def test_times_fold_into_families(tmp_path):
    rows = [
        ("0", "gdn_step<8>", "gpu__time_duration.sum", "usecond", "5.0"),
        ("1", "gdn_step<8>", "gpu__time_duration.sum", "nsecond", "3,000"),
        ("2", "attn_prep", "gpu__time_duration.sum", "usecond", "2.0"),
    ]
    text = summary(_csv(tmp_path, rows))
    lines = text.splitlines()
    assert lines[0] == "| kernel | launches | total us | mean us | share |"
    assert "| 2 | 8.0 | 4.00 | 80.0% |" in lines[2]
    assert lines[-1] == "| all | 3 | 10.0 | - | - |"


def test_memory_metrics_add_bandwidth_columns(tmp_path):
    rows = []
    for i, (us, mb, pct, hit) in enumerate([(10.0, 20.0, 50.0, 10.0), (30.0, 100.0, 70.0, 30.0)]):
        rows += [
            (str(i), "attn_combine", "gpu__time_duration.sum", "usecond", str(us)),
            (str(i), "attn_combine", "dram__bytes_read.sum", "Mbyte", str(mb)),
            (
                str(i),
                "attn_combine",
                "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "%",
                str(pct),
            ),
            (str(i), "attn_combine", "lts__t_sector_hit_rate.pct", "%", str(hit)),
        ]
    lines = summary(_csv(tmp_path, rows)).splitlines()
    assert lines[0].endswith("| MB read | GB/s | DRAM % of peak | L2 hit % |")
    # 120 MB in 40 us: 60 MB a launch, 3000 GB/s; mean DRAM share 60%, mean hit rate 20%.
    assert lines[2] == "| attn_combine | 2 | 40.0 | 20.00 | 100.0% | 60.00 | 3000 | 60.0 | 20.0 |"


def test_step_shares_add_up_to_each_replays_span():
    """With overlapped launches a kernel's share is its end past the latest end before it:
    the early-started next kernel gets only what it adds, one outlasted by an earlier kernel
    gets nothing, a gap before a kernel is its own, and the shares sum to the span."""
    one = [
        (0, 10_000, "gemv"),  # 10 us
        (4_000, 13_000, "gdn"),  # starts early, adds 3 us
        (5_000, 12_000, "tiny"),  # outlasted by gdn: 0
        (15_000, 16_000, "gemv"),  # 2 us gap, then 1 us: 3 us
    ]
    later = [(a + 100_000, b + 100_000, n) for a, b, n in one]  # a second replay, the same
    shares = step_shares(later + one, 2)
    assert shares == {"gemv": 13.0, "gdn": 3.0, "tiny": 0.0}
    assert sum(shares.values()) == 16.0  # first start to last end of a replay
