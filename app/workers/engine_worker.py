"""The engine worker: one long-lived QObject on one QThread owns every engine call.

GUI thread (app/controllers.py)    worker thread (this module)
  EngineController.load()  --sig-->  EngineWorker.load()      (slow, blocks only this thread)
  EngineController.send()  --sig-->  EngineWorker.generate()  loops over engine.generate(...)
                                     (a long chat's oldest messages left out: engine/context_fit.py;
                                     its thinking held to a budget: engine/thinking_budget.py)
  EngineController.stop()  -- threading.Event.set() --------> checked by the engine per token
  widgets  <--- tokens(batched ~30 ms), prompt_progress, finished, failed, loaded, held ---

Exceptions never cross the thread: they are caught here and emitted with the exception's
class name and message.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.engine_bridge import EngineLike, Loader, LoadRequest, ReplyRequest
from app.state.chat_history import NUMERIC_STATS
from engine.context_fit import fit_prompt
from engine.errors import RequestRefused
from engine.request_types import NO_TOKEN, progress_args
from engine.thinking_budget import applies, generate_within
from engine.tokenizer import CloseWatch

log = logging.getLogger(__name__)

BATCH_S = 0.03
PROGRESS_S = 0.25  # the prompt's progress, at most this often (and its end)
CPU_REFUSED = (
    "This engine would run on the CPU (numpy backend), and the setting "
    "'Refuse CPU mode' is on. Turn it off in Settings > Engine to run on the CPU, "
    "or run Snug on a machine with an NVIDIA GPU."
)


class CpuModeRefused(Exception):
    """The user asked never to run on the CPU, and no GPU backend is available."""


class LoadCancelled(Exception):
    """Cancel was pressed while the model loaded (EngineController.cancel_load)."""


class EngineWorker(QObject):
    """Lives on the engine thread. Its slots are called through queued signals only."""

    load_progress = Signal(str, float)
    loaded = Signal(dict)
    load_failed = Signal(str, str)
    unloaded = Signal()
    tokens = Signal(int, str, int)  # request id, text, the reply's tokens so far
    prompt_progress = Signal(int, int, int)  # request id, the prompt's tokens run, of how many
    finished = Signal(int, dict)
    failed = Signal(int, str, str)
    held = Signal(object)  # bytes: can exceed a 32-bit int
    stopped = Signal()

    def __init__(self, loader: Loader) -> None:
        super().__init__()
        self._loader = loader
        self._engine: EngineLike | None = None

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        self._unload_quietly()
        try:
            no_gpu = request.settings.backend == "numpy" or request.gpu_present is False
            if request.refuse_cpu and no_gpu:
                raise CpuModeRefused(CPU_REFUSED)
            engine = self._loader(request, self._progress_of(request))
            if request.refuse_cpu and engine.backend_name != "cuda":
                engine.unload()
                raise CpuModeRefused(CPU_REFUSED)
        except Exception as exc:  # every failure reaches the GUI as a message
            self.load_failed.emit(type(exc).__name__, str(exc))
            return
        self._engine = engine
        self.loaded.emit(
            {
                "model_dir": request.model_dir,
                "backend": engine.backend_name,
                "decision": getattr(engine, "decision", None),
                "held": self._held(),
                "drafting": getattr(engine, "drafting", ""),
                # a server's model: the context it says it runs with (None: it does not say)
                "context": getattr(engine, "served_context", request.context),
                "streams": request.streams,
                # what attached files cost, counted before they are sent (thread-safe)
                "tokenizer": getattr(engine, "tokenizer", None),
            }
        )
        self.held.emit(self._held())

    def _so_far(self, request: ReplyRequest) -> tuple[int, ...]:
        """The ids of the text a reply gone on with (Continue) has so far, where the engine's
        tokenizer is here (not a remote server's)."""
        tokenizer = getattr(self._engine, "tokenizer", None)
        if not request.partial or tokenizer is None:
            return ()
        return tuple(tokenizer.encode(request.partial))

    def _progress_of(self, request: LoadRequest) -> Any:
        """The load's progress callback: each stage to the GUI; a cancel set meanwhile
        raises LoadCancelled there, and the engine releases what the load allocated."""

        def progress(stage: str, fraction: float) -> None:
            if request.cancel is not None and request.cancel.is_set():
                raise LoadCancelled("The load was cancelled; nothing of it is held.")
            self.load_progress.emit(stage, float(fraction))

        return progress

    @Slot(int, object)
    def generate(self, request_id: int, request: ReplyRequest) -> None:
        if self._engine is None:
            self.failed.emit(request_id, "NoModelLoaded", "Load a model before sending a message.")
            return
        pending: list[str] = []
        last = time.monotonic()
        final: Any = None
        count = 0  # the reply's tokens so far (the status line's rate)
        thought = _Thought()  # how long the reply thought, where it closes its thinking
        params, cancel = request.params, request.cancel
        said = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if done >= total or now - said[0] >= PROGRESS_S:
                said[0] = now
                self.prompt_progress.emit(request_id, done, total)

        more = progress_args(self._engine, progress)  # not for a remote or stand-in engine
        events: Any = None
        try:
            ids, left_out = self._prompt(request)
            budget = request.thinking_budget
            so_far = self._so_far(request)
            if so_far:  # a reply gone on with: its penalties count its text so far
                params = replace(params, earlier=(*params.earlier, *so_far))
            if applies(self._engine, ids, budget):
                # A reply gone on with has thought its text so far (its thinking is open).
                events = generate_within(
                    self._engine, ids, params, budget, cancel, len(so_far), **more
                )
            elif budget and getattr(self._engine, "takes_thinking_budget", False):
                events = self._engine.generate(ids, params, cancel, thinking_budget=budget)
            else:
                events = self._engine.generate(ids, params, cancel, **more)
            for event in events:
                if event.text:
                    pending.append(event.text)
                    thought.see(event.text)
                count += event.token_id != NO_TOKEN
                now = time.monotonic()
                if pending and (now - last >= BATCH_S or event.finished):
                    self.tokens.emit(request_id, "".join(pending), count)
                    pending.clear()
                    last = now
                if event.finished:
                    final = event
                    break
        except Exception as exc:  # ScratchGrowFailed, out of memory, template errors...
            _close(events)
            if pending:
                self.tokens.emit(request_id, "".join(pending), count)
            self.failed.emit(request_id, type(exc).__name__, str(exc))
            self.held.emit(self._held())
            return
        if pending:
            self.tokens.emit(request_id, "".join(pending), count)
        summary = _summary(final, cancel)
        if thought.seconds is not None and not request.partial:  # whole: not gone on with
            summary["thinking_s"] = round(thought.seconds, 2)
        if left_out:
            summary["left_out"] = left_out  # the stats line says so (engine/context_fit.py)
        self.finished.emit(request_id, summary)
        # Then the engine saves the reply's state (a disk copy too) and frees its stream, after
        # the window has the reply and before the next request or the memory figure.
        _close(events)
        self.held.emit(self._held())

    def _prompt(self, request: ReplyRequest) -> tuple[Any, int]:
        """The request's prompt, fitted to the context, and the messages it leaves out; a
        reply gone on with follows as text (`partial`), the room for it kept as well."""
        engine = self._engine
        tokenizer = getattr(engine, "tokenizer", None)
        if request.partial and tokenizer is None:
            raise RequestRefused("a reply from a remote server cannot be continued here")
        partial = tokenizer.encode(request.partial) if request.partial else []
        most = (getattr(request.params, "max_new_tokens", None) or 1 << 30) + len(partial)
        ids, left_out = fit_prompt(
            engine, request.messages, request.thinking, most, request.left_out
        )
        return (list(ids) + partial if partial else ids), left_out

    @Slot()
    def unload(self) -> None:
        self._unload_quietly()
        self.unloaded.emit()
        self.held.emit(0)

    @Slot()
    def shutdown(self) -> None:
        """Last call on this thread: unload, then end the thread's event loop."""
        self._unload_quietly()
        self.stopped.emit()
        QThread.currentThread().quit()

    def _unload_quietly(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                engine.unload()
            except Exception as exc:  # unloading must not take the thread down
                self.load_failed.emit(type(exc).__name__, f"while unloading: {exc}")

    def _held(self) -> int:
        try:
            return int(self._engine.held_bytes()) if self._engine is not None else 0
        except Exception:
            return 0


def _close(events: Any) -> None:
    """End a reply read to its final event (or left on an error): the engine saves its state
    and frees its stream now, not whenever the generator is let go. A failure there (a state
    not saved) is logged: the reply is whole."""
    close = getattr(events, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:
        log.exception("The engine could not end the reply cleanly")


class _Thought:
    """When a streaming reply closes its thinking (`</think>`), seconds from its first
    text: "Thought for 12 s" above the answer."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.seconds: float | None = None
        self._close = CloseWatch()

    def see(self, text: str) -> None:
        now = time.monotonic()
        if self.start is None:
            self.start = now
        if self.seconds is None and self._close.feed(text):
            self.seconds = now - self.start


def _summary(event: Any, cancel: threading.Event | None) -> dict:
    stats = getattr(event, "stats", None)
    reason = getattr(event, "finish_reason", None)
    if reason is None:
        reason = "cancelled" if cancel is not None and cancel.is_set() else "stop"
    out: dict[str, Any] = {"finish_reason": reason}
    if stats is not None:
        for name in NUMERIC_STATS:
            out[name] = getattr(stats, name, None)
    return out
