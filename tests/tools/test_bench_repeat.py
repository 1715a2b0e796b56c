"""tools/bench_repeat.py's smoke run on the numpy backend: every repeat of a prompt is
restored whole, with the reply of a fresh read; the table's JSON holds each row."""

from __future__ import annotations

import json

from tools import bench_repeat


def test_the_smoke_run_restores_every_repeat_whole(tmp_path):
    bench_repeat.main(
        ["--backend", "numpy", "--shape", "tiny", "--prompts", "48", "--limits", "none",
         "--new-tokens", "3", "--repeats", "2", "--workdir", str(tmp_path / "w"),
         "--out", str(tmp_path)]
    )  # fmt: skip
    rows = json.loads((tmp_path / "repeat.json").read_text())["rows"]
    assert [(r["kind"], r["length"]) for r in rows] == [("chat", 48), ("raw", 48)]
    for row in rows:
        assert row["whole"] == 2 and row["same"] and row["saves_at_prompt_end"]
        assert min(row["first"], row["again"], row["reread"]) > 0
