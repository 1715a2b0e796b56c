"""`snug --smoke MODEL_DIR [--screenshot PNG]`: the whole app once, as a check of a build.

Opens the window with settings and chats in a throwaway folder, adds MODEL_DIR as a local
folder, loads it through the Load panel, sends one message from the composer, waits for the
reply, saves a screenshot and exits 0 (1 on any failure, with the reason on stderr). It
prints one JSON line of timings (seconds since the process started) on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop, QSettings

PROMPT = "Hello! Who are you?"


def _pump(seconds: float, until: Callable[[], bool]) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
        if until():
            return True
        time.sleep(0.005)
    return until()


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), to time the launch itself."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run(model_dir: str, screenshot: str | None, started: float, timeout_s: float = 600) -> int:
    from app.context import build_context
    from app.main_window import MainWindow

    times: dict[str, float] = {}

    age = process_age()
    launch = started - (age - (time.monotonic() - started)) if age is not None else started

    def mark(name: str) -> None:
        times[name] = round(time.monotonic() - launch, 2)  # seconds since the process began

    base = Path(tempfile.mkdtemp(prefix="snug-smoke-"))
    store = QSettings(str(base / "snug.ini"), QSettings.Format.IniFormat)
    ctx = build_context(store=store, chats_dir=base / "chats")
    s = ctx.settings
    s.set("engine/context", 1024)
    s.set("sampling/max_new_tokens", 12)
    s.set("sampling/temperature", 0.0)
    window = MainWindow(ctx)
    window.resize(1280, 800)
    window.show()
    _pump(5, lambda: window.isVisible())
    mark("window_shown")
    failure: list[str] = []
    ctx.engine.load_failed.connect(lambda cls, msg: failure.append(f"load failed: {cls}: {msg}"))
    ctx.engine.failed.connect(lambda _id, cls, msg: failure.append(f"reply failed: {cls}: {msg}"))
    try:
        entry = window.library.add_folder(model_dir)
        if entry is None:
            raise RuntimeError(window.library.message.text())
        window.choose(entry)
        window.load.load()
        if not _pump(timeout_s, lambda: ctx.engine.state == "ready" or bool(failure)):
            raise RuntimeError(f"the model did not load within {timeout_s:.0f} s")
        if failure:
            raise RuntimeError(failure[0])
        mark("model_loaded")
        window.chat.input.setPlainText(PROMPT)
        window.chat.send_button.click()
        if not _pump(timeout_s, lambda: not ctx.chats.busy and ctx.chats.current.turns != []):
            raise RuntimeError(f"no reply within {timeout_s:.0f} s")
        if failure:
            raise RuntimeError(failure[0])
        reply = ctx.chats.current.turns[-1]
        if reply.role != "assistant":
            raise RuntimeError(f"the last turn is {reply.role}: {reply.content}")
        mark("reply_done")
        _pump(0.5, lambda: False)
        if screenshot:
            Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
            window.grab().save(screenshot)
        times["backend"] = ctx.engine.info.get("backend")
        times["reply_chars"] = len(reply.content)
        sys.stdout.write(json.dumps(times) + "\n")
        return 0
    except Exception as exc:  # the smoke run reports every failure the same way
        sys.stderr.write(f"snug --smoke: {exc}\n")
        if screenshot:
            window.grab().save(screenshot)
        return 1
    finally:
        window.close()
