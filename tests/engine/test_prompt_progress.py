"""A long prompt says how far it has run and stops between its windows (Engine.generate's
`progress` and `cancel`), on the numpy backend; the stream and the engine stay usable."""

from __future__ import annotations

import threading

from engine.config import EngineSettings
from engine.request_types import NO_TOKEN
from engine.session import Engine, GenerationParams


def test_the_prompt_reports_its_windows_and_stops_between_them(tiny_checkpoint, tmp_path):
    settings = EngineSettings(backend="numpy", prompt_cache_dir=str(tmp_path))
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    engine = Engine.load(model, settings, context=512, max_rows=16)
    try:
        prompt = [(7 * i) % 200 + 10 for i in range(100)]
        params = GenerationParams(max_new_tokens=3, temperature=0.0)
        seen: list[tuple[int, int]] = []
        events = list(engine.generate(prompt, params, progress=lambda *p: seen.append(p)))
        assert [t for _d, t in seen] == [100] * len(seen) and seen[-1] == (100, 100)
        assert [d for d, _t in seen] == sorted({d for d, _t in seen})  # window by window
        assert len(seen) >= 100 // 16 and events[-1].stats.new_tokens == 3
        whole = [e.token_id for e in events]

        cancel, windows = threading.Event(), []

        def stop_after_two(done: int, total: int) -> None:
            windows.append(done)
            if len(windows) == 2:
                cancel.set()  # as Stop does while the prompt runs

        other = [(11 * i) % 200 + 10 for i in range(100)]  # nothing of it saved: no resume
        (only,) = list(engine.generate(other, params, cancel, progress=stop_after_two))
        assert only.finished and only.finish_reason == "cancelled" and only.token_id == NO_TOKEN
        assert only.stats.new_tokens == 0 and len(windows) == 2  # no window after the stop
        again = [e.token_id for e in engine.generate(prompt, params)]
        assert again == whole  # the engine answers as before
    finally:
        engine.unload()
