"""tools/bench_small_card.py without a GPU: the table and the targets' verdicts from a run's
cells, the matrix's order and time budget with a stand-in for the cell's process, merging
runs, and a smoke run of one cell in its own process on the numpy backend."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tools.bench_small_card import main, parse_args, run_matrix
from tools.small_card_report import COLUMNS, GIB, merge, plan_text, table, verdicts

META = {"gpu": "NVIDIA H200", "commit": "abc1234", "date": "2026-12-01", "new_tokens": 64}


def _row(prompt: int, ttft: float, decode: float, plan: float = 3.0, pool: float = 3.0) -> dict:
    return {
        "prompt": prompt,
        "new_tokens": 64,
        "ttft_s": ttft,
        "prefill_tok_s": prompt / ttft,
        "decode_tok_s": decode,
        "predicted_ttft_s": ttft * 0.9,
        "predicted_decode_tok_s": 691.0,
        "nvml_peak_bytes": int(4.2 * GIB),
        "plan_peak_bytes": int(plan * GIB),
        "pool_peak_bytes": int(pool * GIB),
    }


def _decision(context: int, on_host: bool = True, embeddings: bool = False) -> dict:
    return {
        "context": context,
        "max_rows": 512,
        "eager": True,
        "host_embeddings": embeddings,
        "prompt_cache_on_host": on_host,
    }


def _cell(size: str, limit: float | None, rows: list[dict], context: int, **kw) -> dict:
    first = dict(rows[0], ttft_s=rows[0]["ttft_s"] * 3)  # the first request: 512 tokens
    decision = _decision(context, limit is not None, **kw)
    return {"size": size, "format": "mlx4", "limit_gib": limit, "fits": True, "rows": rows} | {
        "first": first,
        "decision": decision,
        "nvml_baseline_bytes": GIB // 2,
    }


def _cells() -> list[dict]:
    none_4b = [_row(512, 0.04, 694.0), _row(8192, 0.6, 562.0), _row(16384, 1.3, 518.0)]
    at_4 = [_row(512, 0.035, 693.0), _row(8192, 1.0, 561.0), _row(16384, 2.2, 500.0)]
    at_35 = [_row(512, 0.035, 694.0), _row(8192, 0.95, 560.0, 3.0, 2.8)]
    at_35.append({"prompt": 16384, "skipped": "not admitted"})
    return [
        _cell("4B", None, none_4b, 32896),
        _cell("4B", 4.0, at_4, 33792),
        _cell("4B", 3.5, at_35, 17664),
        _cell("9B", None, [_row(512, 0.06, 316.0)], 32896),
        _cell("9B", 6.0, [_row(512, 0.07, 300.0)], 32768, embeddings=True),
        {"size": "9B", "limit_gib": 4.0, "fits": False, "reason": "needs 1.2 GiB", "rows": []},
        {"size": "9B", "format": "mlx4", "limit_gib": 3.0, "error": "not run: budget"},
    ]


def _cells_of(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()[2:]]


def test_every_row_has_every_column_and_the_shares_of_the_unconstrained_run():
    rows = _cells_of(table(_cells(), META))
    header, body = rows[0], rows[2:]
    assert header == list(COLUMNS)
    assert all(len(r) == len(header) for r in body)
    col = {name: i for i, name in enumerate(header)}
    at_4 = [r for r in body if r[:2] == ["4B", "4 GiB"]]
    assert at_4[0][col["plan"]] == "33,792 tokens, 512 rows, eager, saved states on host"
    assert [r[col["% of unconstrained decode"]] for r in at_4] == ["99.9%", "99.8%", "96.5%"]
    assert at_4[0][col["first-request TTFT s"]] == "0.105"  # the first request: 512 tokens
    assert at_4[1][col["first-request TTFT s"]] == "-"
    assert at_4[1][col["plan / pool peak GiB (diff)"]] == "3.000 / 3.000 (+0.0%)"
    assert at_4[1][col["NVML peak GiB"]] == "4.20 (+3.70)"
    unconstrained = next(r for r in body if r[col["limit"]] == "none")
    assert unconstrained[col["% of unconstrained decode"]] == "-"
    skipped = next(r for r in body if r[col["prompt"]] == "16,384" and r[1] == "3.5 GiB")
    assert skipped[col["warm TTFT s"]] == "not admitted"
    refused = next(r for r in body if r[1] == "4 GiB" and r[0] == "9B")
    assert refused[col["plan"]] == "does not fit: needs 1.2 GiB"
    nine = next(r for r in body if r[1] == "6 GiB")
    assert nine[col["plan"]].endswith("embeddings on host, saved states on host")
    assert at_4[0][col["decode tok/s (% roofline)"]] == "693.0"  # no bandwidth measured


def test_a_measured_roofline_share_follows_the_decode_rate():
    cells = _cells()
    cells[0]["rows"][0]["roofline_pct"] = 40.56
    rows = _cells_of(table(cells, META))
    col = {name: i for i, name in enumerate(rows[0])}
    first = next(r for r in rows[2:] if r[:2] == ["4B", "none"])
    assert first[col["decode tok/s (% roofline)"]] == "694.0 (40.6%)"


def test_the_verdicts_name_the_numbers():
    got = verdicts(_cells())
    assert got[0].endswith("met (8,192: 99.8%, 16,384: 96.5%)")
    assert got[1].endswith("met (16,384 tokens: 2.200 / 1.300 s = 1.69x)")
    assert got[2].endswith("missed (8,192 tokens: 0.950 / 0.600 s = 1.58x)")
    assert got[3].endswith("met (512: 94.9%)")
    assert "missed in 1 of 10 rows" in got[4] and "4B 3.5 GiB 8,192" in got[4]


def test_targets_without_their_rows_are_not_measured():
    got = verdicts(_cells()[:1])
    assert all(line.endswith("not measured") for line in got[:4])


def _args(**kw) -> SimpleNamespace:
    base = {"sizes": "4B,9B", "limits": "none,4", "format": "mlx4", "time_budget": 0.0}
    return SimpleNamespace(**(base | kw))


def test_the_matrix_runs_each_cell_in_order_and_stops_at_the_time_budget():
    now = [0.0]
    seen = []

    def runner(args, size, limit, left):
        seen.append((size, limit, left))
        now[0] += 50.0
        return {"size": size, "limit_gib": limit, "rows": []}

    reports = []
    cells = run_matrix(_args(time_budget=120.0), runner, lambda: now[0], reports.append)
    assert seen == [("4B", None, 120.0), ("4B", 4.0, 70.0)]  # 20 s left: under MIN_CELL_S
    assert [(c["size"], c["limit_gib"]) for c in cells] == [
        ("4B", None),
        ("4B", 4.0),
        ("9B", None),
        ("9B", 4.0),
    ]
    assert cells[2]["error"].startswith("not run") and len(reports) == 4
    now[0] = 0.0
    seen.clear()
    run_matrix(_args(), runner, lambda: now[0])
    assert [left for *_, left in seen] == [None] * 4


def test_merging_runs_orders_cells_by_size_and_limit(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    cells = _cells()
    a.write_text(json.dumps({"meta": META, "cells": cells[3:]}))
    b.write_text(json.dumps({"meta": META | {"commit": "def5678"}, "cells": cells[:3]}))
    merged, meta = merge([str(a), str(b)])
    assert [(c["size"], c["limit_gib"]) for c in merged] == [
        ("4B", None),
        ("4B", 4.0),
        ("4B", 3.5),
        ("9B", None),
        ("9B", 6.0),
        ("9B", 4.0),
        ("9B", 3.0),
    ]
    assert meta["commit"] == "abc1234 + def5678"


def test_defaults_are_the_whole_matrix():
    args = parse_args([])
    assert args.sizes == "0.8B,4B,9B" and args.limits == "none,8,6,4,3.5,3"
    assert args.prompts == "512,8192,16384,32768" and args.first_prompt == 512
    assert args.new_tokens == 64 and args.reserve_gib == 0.5


def test_a_cell_in_its_own_process_on_the_numpy_backend(tmp_path, capsys):
    out = tmp_path / "out"
    flags = "--backend numpy --sizes tiny --limits none --prompts 8,24 --new-tokens 3"
    main([*flags.split(), "--workdir", str(tmp_path / "work"), "--out", str(out)])
    (cell,) = json.loads((out / "small_card.json").read_text())["cells"]
    assert cell["fits"] and cell["backend"] == "numpy" and cell["first"]["prompt"] == 8
    assert cell["context"] == 24 + 3 + 64
    assert [r["prompt"] for r in cell["rows"]] == [8, 24]
    assert all(r["new_tokens"] == 3 and r["ttft_s"] > 0 for r in cell["rows"])
    assert cell["start_to_first_token_s"] > cell["first"]["ttft_s"]
    text = (out / "small_card.md").read_text()
    assert "| tiny | none | numpy backend, 91 tokens (no plan) | 8 | " in text
    assert text.strip() in capsys.readouterr().out


def test_a_named_context_reaches_the_cell_and_bounds_its_prompts(tmp_path):
    flags = "--backend numpy --sizes tiny --limits none --prompts 8,40 --new-tokens 3"
    out = tmp_path / "out"
    main([*flags.split(), "--context", "32", "--workdir", str(tmp_path / "w"), "--out", str(out)])
    (cell,) = json.loads((out / "small_card.json").read_text())["cells"]
    assert cell["context"] == 32 and cell["rows"][1]["skipped"] == "not admitted"


def test_the_cell_reads_the_plan_and_the_pool_where_the_backend_has_one(tmp_path, monkeypatch):
    """The numpy backend with a simulated card: the plan's path of a cell, refused and
    admitted (the numpy backend allocates nothing through the pool)."""
    from engine.backends.numpy_backend import NumpyBackend
    from engine.config import EngineSettings
    from engine.memory import SimulatedPool
    from engine.testing.synth import model_dir
    from tools.bench_small_card import serve_cell

    monkeypatch.setattr(NumpyBackend, "pool", SimulatedPool(GIB), raising=False)
    path = model_dir(tmp_path, "tiny", "mlx4")
    settings = EngineSettings(backend="numpy", compute_dtype="float32").with_gib(reserve=0)
    refused = serve_cell(path, settings.with_gib(limit=0.001), None, 8, [16], 3)
    assert not refused["fits"] and refused["decision"]["verdict"] == "does not fit"
    cell = serve_cell(path, settings, 64, 8, [16, 80], 3, log=lambda _: None)
    assert cell["decision"]["context"] == 64 and cell["rows"][1]["skipped"] == "not admitted"
    row = cell["rows"][0]
    budget = cell["decision"]["breakdown"]["prompt_cache"]
    assert 0 < row["cache_held_bytes"] and row["pool_peak_bytes"] == 0
    assert row["plan_peak_bytes"] - min(row["cache_held_bytes"], budget) > 0
    assert plan_text(cell) == "64 tokens, 2048 rows, eager"  # widened: the card has room


def test_a_16k_prompt_is_any_within_five_percent_of_16384():
    """The tables' 8,000- and 16,000-token prompts stand for the targets' 8K and 16K."""
    none_4b = [_row(512, 0.024, 689.0), _row(8000, 0.418, 560.4), _row(16000, 1.194, 512.2)]
    at_4 = [_row(512, 0.024, 693.0), _row(8000, 0.571, 560.8), _row(16000, 1.186, 515.5)]
    at_35 = [_row(512, 0.023, 692.9), _row(8000, 0.755, 560.7)]
    cells = [
        _cell("4B", None, none_4b, 16_128),
        _cell("4B", 4.0, at_4, 33_792),
        _cell("4B", 3.5, at_35, 17_664),
    ]
    lines = verdicts(cells)
    assert any("16,384 tokens within 2x" in v and "met (16,000 tokens" in v for v in lines)
    assert any("8,192 tokens within 1.5x" in v and "missed (8,000 tokens" in v for v in lines)
    assert any("8,192 or more" in v and "met (8,000: 100.1%, 16,000: 100.6%)" in v for v in lines)


def test_choices_name_each_cells_variants_most_common_first(tmp_path, capsys):
    """`--choices` reads a run's small_card.json: a line a cell with the variants its
    projections ran and how many shapes ran each; cells without choices (numpy, errors)
    give no line."""
    four = {
        "(4, 1, 2560, 9216, False, 0, True)": ["mma", 0, 2, 4, False],
        "(4, 1, 9216, 2560, True, 1, True)": ["mma", 4, 2, 2, True],
        "(4, 1, 2560, 4096, False, 2, True)": ["mma", 0, 2, 4, False],
    }
    cells = [
        {"size": "4B", "limit_gib": None, "projection_choices": four},
        {"size": "4B", "limit_gib": 4.0, "error": "not run"},
        {"size": "0.8B", "limit_gib": 4.0, "projection_choices": {"k": ["tc", 8]}},
    ]
    (tmp_path / "small_card.json").write_text(json.dumps({"meta": META, "cells": cells}))
    main(["--choices", str(tmp_path / "small_card.json")])
    assert capsys.readouterr().out.splitlines() == [
        "4B none: (mma,0,2,4,False) x2  (mma,4,2,2,True) x1",
        "0.8B 4 GiB: (tc,8) x1",
    ]


def _cell_of(tmp_path, monkeypatch, flags: str) -> tuple[list[str], dict]:
    """Run the matrix with `flags`: the one cell's command line, and the JSON's meta."""
    import tools.bench_small_card as bench

    seen: list[list[str]] = []
    real_run = bench.subprocess.run
    monkeypatch.setattr(
        bench.subprocess, "run", lambda cmd, **kw: seen.append(cmd) or real_run(cmd, **kw)
    )
    out = tmp_path / "out"
    main([*flags.split(), "--workdir", str(tmp_path / "w"), "--out", str(out)])
    (cell_cmd,) = [cmd for cmd in seen if "--cell" in cmd]
    return cell_cmd, json.loads((out / "small_card.json").read_text())["meta"]


def test_keep_saved_reaches_the_cell_and_its_requests_keep_the_cache(tmp_path, monkeypatch):
    """`--keep-saved`: the cell's process is told, and its requests after the first start
    with the states saved before them (a chat's later turns), not an empty prompt cache."""
    import tools.bench_small_card as bench

    flags = "--backend numpy --sizes tiny --limits none --prompts 8,8 --new-tokens 3 --keep-saved"
    cell_cmd, meta = _cell_of(tmp_path, monkeypatch, flags)
    assert "--keep-saved" in cell_cmd and meta["keep_saved"] is True
    cleared: list[bool] = []
    monkeypatch.setattr(
        bench,
        "_request",
        lambda *a: cleared.append(a[-2]) or {"prompt": a[1], "prefill_tok_s": 1e6},
    )
    args = parse_args(["--cell", *flags.split()[:-1], "--size", "tiny", "--limit", "none"])
    for keep in (True, False):
        args.keep_saved, args.workdir = keep, str(tmp_path / "w")
        args.cell_out = str(tmp_path / f"cell-{keep}.json")
        bench.cell_main(args)
    assert cleared == [False, False, False, False, True, True]  # the first request: never


def test_sampled_cells_draw_with_the_apps_defaults(tmp_path, monkeypatch):
    """`--sampled`: the cell's process is told, and every request it serves (the first one
    too) draws with the app's sampling defaults, seeded; without it every one is greedy."""
    import tools.bench_small_card as bench
    from engine.session import Engine

    flags = "--backend numpy --sizes tiny --limits none --prompts 8 --new-tokens 3 --sampled"
    cell_cmd, meta = _cell_of(tmp_path, monkeypatch, flags)
    assert "--sampled" in cell_cmd and meta["sampled"] is True
    params = []
    real_generate = Engine.generate
    monkeypatch.setattr(
        Engine,
        "generate",
        lambda self, ids, p, *a, **kw: params.append(p) or real_generate(self, ids, p, *a, **kw),
    )
    args = parse_args(["--cell", *flags.split()[:-1], "--size", "tiny", "--limit", "none"])
    for sampled in (True, False):
        args.sampled, args.workdir = sampled, str(tmp_path / "w")
        args.cell_out = str(tmp_path / f"cell-{sampled}.json")
        bench.cell_main(args)
        assert "error" not in json.loads(Path(args.cell_out).read_text())
    drawn, greedy = params[:2], params[2:]
    assert len(drawn) == len(greedy) == 2
    for p in drawn:
        assert not p.is_greedy and p.seed is not None
        assert (p.temperature, p.top_k, p.top_p, p.presence_penalty) == (0.7, 20, 0.8, 1.5)
    assert all(p.is_greedy for p in greedy)
