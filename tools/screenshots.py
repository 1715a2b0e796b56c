"""Save screenshots of the app: main window, load panel with a verdict, a chat mid-stream.

    xvfb-run -a python tools/screenshots.py                 # demo data (no model needed)
    xvfb-run -a python tools/screenshots.py --model-dir DIR # a real checkpoint folder

PNGs go to docs/screenshots/ (or --out). The window is 1280x800.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop

from app.demo import demo_context
from app.engine_bridge import LoadRequest
from app.main import make_app
from app.main_window import MainWindow

GIB = 1 << 30


def pump(seconds: float, until=None) -> None:
    """Run the event loop for `seconds`, or until `until()` is true."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
        if until is not None and until():
            return
        time.sleep(0.01)


def save(widget, path: Path) -> None:
    pump(0.3)
    widget.grab().save(str(path))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="load this checkpoint instead of the demo engine")
    parser.add_argument("--out", default="docs/screenshots")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    app = make_app(["snug"])
    loader = None
    if args.model_dir:
        from app.engine_bridge import load_engine

        loader = load_engine
    ctx = demo_context(Path(tempfile.mkdtemp(prefix="snug-shots-")), delay=0.03, loader=loader)
    ctx.settings.set("chat/thinking", True)
    window = MainWindow(ctx)
    window.resize(1280, 800)
    window.show()
    pump(1.5, until=lambda: len(ctx.machine.history) >= 3)

    model_dir = args.model_dir or str(Path(tempfile.gettempdir()) / "Qwen3.5-4B-MLX-4bit")
    s = ctx.settings
    ctx.engine.load(LoadRequest(model_dir, s.engine_settings(), s.context, s.streams, s.max_rows))
    pump(120, until=lambda: ctx.engine.state in ("ready", "empty"))

    # 1. Main window: a finished reply, the gauge with some history.
    ctx.chats.send("Why does a 4-bit model fit on my 8 GB laptop GPU?")
    pump(60, until=lambda: not ctx.chats.busy)
    pump(2.5)
    window.tabs.setCurrentWidget(window.library)
    save(window, out / "main_window.png")

    # 2. Load panel with a verdict, for a model that fits and one that does not.
    fits = ctx.library.find("qwen3.5-4b-4bit")
    window.choose(fits)
    save(window, out / "load_panel.png")
    window.choose(ctx.library.find("qwen3.5-9b-bf16"))
    save(window.load, out / "load_panel_does_not_fit.png")
    window.choose(fits)

    # 3. A chat mid-stream.
    ctx.chats.new_chat()
    ctx.chats.send("Explain the memory reserve setting.")
    pump(30, until=lambda: len(ctx.chats.current.turns[-1].content) > 420)
    save(window, out / "chat_streaming.png")
    ctx.chats.stop()
    pump(1.0, until=lambda: not ctx.chats.busy)

    window.close()
    for path in sorted(out.glob("*.png")):
        print(path)
    app.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
