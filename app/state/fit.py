"""FitAdvisor: fit verdicts for library entries on this machine, planned off the UI thread.

    GUI thread                                   planning thread ("snug-plan")
      views call verdict(entry, sizes)
        cached?  -> the Decision
        else     -> CHECKING (or the last verdict
                    while only free memory moved),
                    the job is queued
      80 ms after the last request  --jobs-->    PlanWorker.run: for each job still wanted,
                                                 planning.plan (GPU) or host_fit (CPU)
      cache[key] = decision  <--done(key, d)--
      decided.emit()  -> views ask again (cache hit)

A job's key is (model, sizes, settings, machine bucket): the free memory of the card in
FREE_STEP steps (RAM in RAM_STEP steps without a GPU). A plan is computed at the bucket's
lower edge, so a cached verdict is exactly the one its key asks for. A job whose settings or
bucket are no longer the current ones when the worker reaches it is skipped.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QThread, QTimer, Signal, Slot

from app import planning
from app.state import host_fit
from app.state.catalog import Entry, Library
from app.state.machine import Machine
from app.state.settings import AppSettings

Planner = Callable[..., Any]
REPLAN_KEYS = {
    "memory/reserve_gib",
    "memory/limit_gib",
    "engine/context",
    "engine/streams",
    "engine/max_rows",
    "engine/backend",
    "engine/kv_cache",
    "engine/draft_tokens",  # the MTP head's weights and state (engine.memory.draft)
}
FREE_STEP = 128 << 20  # the card's free bytes are planned in steps of this
RAM_STEP = 256 << 20  # available RAM likewise, without a GPU
DEBOUNCE_MS = 80
ANNOUNCE_MS = 30  # verdicts landing within this are announced together
PLAN_SWITCH_S = 0.0005  # the GIL switch interval while plans run (see PlanWorker.run)
CACHE_SIZE = 512
CHECKING = planning.PlanProblem("Checking whether it fits…", "Checking…")
GPU_PENDING = planning.PlanProblem("Checking the GPU…", "Checking…")


@dataclass
class Job:
    key: tuple
    fingerprint: tuple
    host: bool
    kwargs: dict = field(default_factory=dict)


class PlanWorker(QObject):
    """Lives on the planning thread; runs jobs in order, skipping the ones no longer wanted."""

    done = Signal(object, object)  # key, decision
    skipped = Signal(object)  # key

    def __init__(self, planner: Planner, host_planner: Planner) -> None:
        super().__init__()
        self._planner, self._host_planner = planner, host_planner
        self.current: tuple | None = None  # written by the GUI thread (one reference: atomic)

    @Slot(object)
    def run(self, jobs: list[Job]) -> None:
        # Planning is pure Python and holds the GIL. PySide6 releases the GIL around most Qt
        # calls, so each Qt call of a UI handler may wait for this thread to hand it back:
        # at the default 5 ms switch interval, a handler with ten Qt calls waited 50 ms.
        # While a batch runs, the interpreter switches threads every PLAN_SWITCH_S instead.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, PLAN_SWITCH_S))
        try:
            for job in jobs:
                if job.fingerprint != self.current:
                    self.skipped.emit(job.key)
                    continue
                try:
                    decision = (self._host_planner if job.host else self._planner)(**job.kwargs)
                except Exception as exc:  # a planner bug must not end the thread
                    decision = planning.PlanProblem(f"{type(exc).__name__}: {exc}", "Cannot plan")
                self.done.emit(job.key, decision)
        finally:
            sys.setswitchinterval(interval)


class FitAdvisor(QObject):
    """Verdicts with the machine's GPU (or RAM) and the user's settings.

    `changed`: the inputs moved (settings, free memory); views ask again for what they show.
    `decided`: a verdict arrived in the cache; views ask again (now a cache hit).
    """

    changed = Signal()
    decided = Signal()
    _submit = Signal(object)

    def __init__(
        self,
        machine: Machine,
        settings: AppSettings,
        library: Library,
        planner: Planner | None = None,
        parent: QObject | None = None,
        host_planner: Planner | None = None,
    ) -> None:
        super().__init__(parent)
        self.machine = machine
        self.settings = settings
        self.library = library
        self._cache: OrderedDict[tuple, Any] = OrderedDict()
        self._last: dict[tuple, Any] = {}  # the latest verdict per (model, sizes, settings)
        self._inflight: set[tuple] = set()
        self._queue: list[Job] = []
        self._settings_fp: tuple | None = None
        self._seen: tuple | None = None
        self._closed = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(DEBOUNCE_MS)
        self._timer.timeout.connect(self._flush)
        self._announce = QTimer(self)
        self._announce.setSingleShot(True)
        self._announce.setInterval(ANNOUNCE_MS)
        self._announce.timeout.connect(self.decided)
        self._thread = QThread()
        self._thread.setObjectName("snug-plan")
        self._worker = PlanWorker(planner or planning.plan, host_planner or host_fit.plan_on_host)
        self._worker.moveToThread(self._thread)
        self._submit.connect(self._worker.run)
        self._worker.done.connect(self._done)
        self._worker.skipped.connect(self._skipped)
        self._thread.finished.connect(self._worker.deleteLater)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)
        machine.updated.connect(self._machine_moved)
        settings.changed.connect(self._setting_changed)

    # -- inputs
    def _machine_moved(self) -> None:
        seen = self._machine_fp()
        if seen != self._seen:
            self._seen = seen
            self.changed.emit()

    def _setting_changed(self, key: str, _value: object) -> None:
        if key in REPLAN_KEYS:
            self._settings_fp = None
            if key == "memory/reserve_gib":
                self.machine.set_reserve(self.settings.engine_settings().reserve_bytes)
            self.changed.emit()

    def on_cpu(self) -> bool:
        """Whether models run on the CPU here (no GPU, or the numpy backend chosen)."""
        return bool(self.machine.no_gpu) or self._settings_key()[0].backend == "numpy"

    def _machine_fp(self) -> tuple:
        if self.on_cpu():
            return ("host", self.machine.ram_available() // RAM_STEP)
        gpu = self.machine.gpu
        if gpu is None:
            return ("waiting",)
        free = min(gpu.total_bytes, gpu.free_bytes + self.machine.engine_held)
        return ("gpu", gpu.name, gpu.total_bytes, free // FREE_STEP)

    def _settings_key(self) -> tuple:
        """(EngineSettings, context, streams, max_rows), read from the store once per change
        (every store read is a Qt call, and verdicts are asked for often)."""
        if self._settings_fp is None:
            s = self.settings
            es = s.engine_settings()
            self._settings_fp = (es, s.context, s.streams, s.max_rows)
        return self._settings_fp

    # -- queries
    def verdict(
        self,
        entry: Entry,
        context: int | None = None,
        streams: int | None = None,
        max_rows: int | None = None,
    ) -> Any:
        """The cached verdict for `entry` at these sizes, or CHECKING while it is planned."""
        machine_fp = self._machine_fp()
        if machine_fp[0] == "waiting":
            return GPU_PENDING
        settings_fp = self._settings_key()
        sizes = (
            int(context or settings_fp[1]),
            int(streams or settings_fp[2]),
            int(max_rows or settings_fp[3]),
        )
        model = (entry.key, entry.local_dir)
        fingerprint = (settings_fp, machine_fp)
        key = (model, sizes, fingerprint)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if key not in self._inflight:
            job = self._job(entry, sizes, key, fingerprint, machine_fp)
            if not isinstance(job, Job):
                return job
            self._inflight.add(key)
            self._queue.append(job)
            self._timer.start()
        return self._last.get((model, sizes, fingerprint[0], machine_fp[0]), CHECKING)

    def _job(self, entry: Entry, sizes: tuple, key: tuple, fingerprint: tuple, machine_fp: tuple):
        context, streams, max_rows = sizes
        kwargs: dict[str, Any] = {"context": context, "streams": streams}
        if entry.local_dir is not None:
            kwargs["model_dir"] = entry.local_dir
        elif entry.shape:
            fmt = entry.fmt or "bf16"
            try:
                raw = self.library.shapes.get(entry.shape)
                config = planning.shape_config(entry.shape, fmt, entry.group_size, raw)
            except Exception as exc:
                return planning.PlanProblem(f"catalog shape {entry.shape}: {exc}", "Cannot plan")
            kwargs["shape"] = (config, fmt, entry.group_size)
        else:
            return planning.PlanProblem("Unknown model shape; download it to plan.", "Unknown")
        if machine_fp[0] == "host":
            kwargs["available"] = machine_fp[1] * RAM_STEP
            kwargs["settings"] = fingerprint[0][0]  # the KV cache and drafting settings
            return Job(key, fingerprint, True, kwargs)
        gpu = self.machine.gpu
        assert gpu is not None
        free = machine_fp[3] * FREE_STEP
        bucket = planning.Gpu(
            gpu.name, gpu.total_bytes, free, speed=gpu.speed, capability=gpu.capability
        )
        kwargs.update(
            gpu=bucket,
            settings=fingerprint[0][0],
            max_rows=max_rows,
            held=0,  # counted in the bucket's free bytes
        )
        return Job(key, fingerprint, False, kwargs)

    # -- the planning thread
    def _flush(self) -> None:
        current = (self._settings_key(), self._machine_fp())
        self._worker.current = current
        jobs = [j for j in self._queue if j.fingerprint == current]
        for job in self._queue:
            if job.fingerprint != current:
                self._inflight.discard(job.key)
        self._queue = []
        if jobs and not self._closed:
            if not self._thread.isRunning():  # started by the first plan, ended by shutdown()
                self._thread.start()
            self._submit.emit(jobs)

    def _done(self, key: tuple, decision: Any) -> None:
        self._inflight.discard(key)
        self._cache[key] = decision
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        model, sizes, (settings_fp, machine_fp) = key
        self._last[(model, sizes, settings_fp, machine_fp[0])] = decision
        if not self._announce.isActive():  # one `decided` for the verdicts of a batch
            self._announce.start()

    def _skipped(self, key: tuple) -> None:
        self._inflight.discard(key)

    def idle(self) -> bool:
        """No plan queued or running (tests and the screenshot tool wait for this)."""
        return not self._inflight and not self._queue

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """End the planning thread (a plan in progress finishes first); no plan runs after."""
        self._closed = True
        self._timer.stop()
        if not self._thread.isRunning():
            return True
        self._worker.current = None  # jobs still queued are skipped
        self._thread.quit()
        return self._thread.wait(timeout_ms)


def verdict_label(decision: Any) -> str:
    """The badge text of any verdict: a Decision, a HostDecision or a PlanProblem."""
    if isinstance(decision, host_fit.HostDecision):
        return decision.label
    return planning.verdict_label(decision)


def verdict_fits(decision: Any) -> bool:
    """Whether a verdict says the model can be loaded here."""
    if isinstance(decision, host_fit.HostDecision):
        return decision.fits
    value = planning.verdict_value(decision)
    return (
        bool(value) and value != "does not fit" and not isinstance(decision, planning.PlanProblem)
    )
