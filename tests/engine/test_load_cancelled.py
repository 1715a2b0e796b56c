"""A load stopped from its progress callback (the app's Cancel raises there) leaves nothing
held, and the next load of the same model works (numpy backend)."""

from __future__ import annotations

import pytest

from engine.backends.numpy_backend import NumpyBackend
from engine.config import EngineSettings
from engine.session import Engine


class Stop(Exception):
    pass


@pytest.mark.parametrize("at", ["loading weights", "allocating stream state", "warming up"])
def test_a_load_stopped_at_any_stage_holds_nothing(tiny_checkpoint, tmp_path, monkeypatch, at):
    settings = EngineSettings(backend="numpy", prompt_cache_dir=str(tmp_path))
    model = tiny_checkpoint("untied-l8-r2", "mlx4-g64")
    released = []
    release = NumpyBackend.release

    def counted(self):
        released.append(self)
        return release(self)

    def stop(stage, _fraction):
        if stage == at:
            raise Stop(stage)

    monkeypatch.setattr(NumpyBackend, "release", counted)
    with pytest.raises(Stop):
        Engine.load(model, settings, context=256, progress=stop)
    assert len(released) == 1  # what the load had allocated, let go
    engine = Engine.load(model, settings, context=256)
    try:
        assert engine.held_bytes() > 0 and len(released) == 1
    finally:
        engine.unload()
