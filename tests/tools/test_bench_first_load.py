"""tools/bench_first_load.py without a GPU: the stages' spans, the table, and each size's two
loads sharing one kernel cache folder (empty for the first)."""

from __future__ import annotations

import json
import os

import tools.bench_first_load as bench


def test_stage_spans_run_to_the_next_stage():
    stages = [("reading checkpoint", 0.0), ("loading weights", 0.5), ("compiling kernels", 1.5)]
    spans = bench.stage_spans(stages + [("loaded", 21.5)])
    assert spans == {"reading checkpoint": 0.5, "loading weights": 1.0, "compiling kernels": 20.0}


def test_each_size_loads_twice_on_one_cache_the_first_time_empty(monkeypatch, tmp_path):
    seen = []

    def spawn(args, size, cache):
        seen.append((size, cache, sorted(os.listdir(cache))))
        open(os.path.join(cache, f"{size}-{len(seen)}.cubin"), "w").close()
        stages = {"loading weights": 1.0, "compiling kernels": 19.0 / len(seen), "warming up": 5}
        return {"load_s": 26.0 / len(seen), "stages_s": stages, "programs": 60, "program_s": 150}

    monkeypatch.setattr(bench, "spawn", spawn)
    monkeypatch.setattr("engine.testing.synth.model_dir", lambda *a, **k: tmp_path)
    monkeypatch.setattr("engine.device.probe_gpu", lambda: None)
    bench.main(["--sizes", "4B,0.8B", "--out", str(tmp_path / "out"), "--commit", "abc1234"])
    (s1, c1, f1), (s2, c2, f2), (s3, c3, f3), (_, c4, _) = seen
    assert (s1, s2, s3) == ("4B", "4B", "0.8B")
    assert c1 == c2 and f1 == [] and f2 == ["4B-1.cubin"]  # the second finds the first's
    assert c3 == c4 != c1 and f3 == []
    got = json.loads((tmp_path / "out" / "first_load.json").read_text())
    assert got["meta"]["commit"] == "abc1234" and got["meta"]["limit_gib"] == 4.0
    assert [r["cache"] for r in got["rows"]] == ["empty", "filled by the load before"] * 2
    table = bench.table(got["rows"])
    assert "| 4B | empty | 26.0 | 1.0 | 19.0 | 5.0 | 60 (150.0) |" in table
