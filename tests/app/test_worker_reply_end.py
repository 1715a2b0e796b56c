"""The engine thread ends each reply (the engine saves its state and frees its stream) once
it has said the reply is finished, before it says what the engine holds, not whenever its
generator is let go; a failure there is logged and the reply stays whole."""

from __future__ import annotations

import logging
import threading

from fake_engine import FakeEngine

from app.engine_bridge import LoadRequest, ReplyRequest
from app.workers.engine_worker import EngineWorker
from engine.config import EngineSettings
from engine.request_types import GenerationParams


class Ending(FakeEngine):
    """A fake engine whose replies note when they end, and may fail to."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.ended = []
        self.fail_at_end = False

    def generate(self, prompt_ids, params, cancel=None):
        try:
            yield from super().generate(prompt_ids, params, cancel)
        finally:
            self.ended.append(len(prompt_ids))
            if self.fail_at_end:
                raise OSError("disk full")


def _worker():
    worker = EngineWorker(Ending.loader(script=["Hello", " there."], delay=0))
    worker.load(LoadRequest("/m", EngineSettings(backend="numpy"), 4096))
    finished, failed, seen = [], [], []
    worker.finished.connect(lambda rid, summary: finished.append(rid))
    worker.failed.connect(lambda rid, cls, msg: failed.append((cls, msg)))
    # What had ended each time the memory held is said after a reply.
    worker.held.connect(lambda _held: finished and seen.append(len(worker._engine.ended)))
    return worker, finished, failed, seen


def _ask(worker, request_id):
    request = ReplyRequest(
        [{"role": "user", "content": "Hi"}], GenerationParams(), None, threading.Event()
    )
    worker.generate(request_id, request)


def test_a_reply_has_ended_when_the_memory_it_leaves_is_said(qtbot):
    worker, finished, failed, seen = _worker()
    _ask(worker, 1)
    assert finished == [1] and not failed
    assert seen == [1]  # ended after `finished`, before `held`


def test_a_reply_that_fails_to_end_is_still_whole_and_the_failure_logged(qtbot, caplog):
    worker, finished, failed, seen = _worker()
    worker._engine.fail_at_end = True
    with caplog.at_level(logging.ERROR, logger="app.workers.engine_worker"):
        _ask(worker, 2)
    assert finished == [2] and not failed
    assert "could not end the reply" in caplog.text and "disk full" in caplog.text
