"""tools/bench_resume.py on the numpy backend: three processes (a first turn saved to disk,
the next turn after a restart, a fresh prefill) and the table, as the GPU run prints it."""

from __future__ import annotations

import json

from tools.bench_resume import main


def test_the_next_turn_after_a_restart_comes_from_disk_and_equals_a_fresh_prefill(tmp_path, capsys):
    main(
        [
            "--backend", "numpy", "--shape", "tiny", "--history", "200", "--new-tokens", "6",
            "--follow-up", "12", "--max-rows", "64", "--workdir", str(tmp_path / "w"),
            "--out", str(tmp_path / "out"),
        ]
    )  # fmt: skip
    res = json.loads((tmp_path / "out" / "resume.json").read_text())
    assert res["resume"]["restored_from"] == "disk"
    assert res["resume"]["restored_tokens"] == 200 + 6 - 1  # the reply's last token unfed
    assert res["resumed_equals_fresh"] and len(res["resume"]["tokens"]) == 6
    assert res["dtype"] == "float32" and res["format"] == "hf-fp32"
    r = res["resume"]  # where the restore's time went: the file, then the slot
    assert r["restore_read_s"] > 0 and r["restore_slot_s"] > 0
    assert r["restore_read_s"] + r["restore_slot_s"] < r["ttft_s"]
    assert "| resumed after a restart | disk (205 tokens) |" in capsys.readouterr().out
