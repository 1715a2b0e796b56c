"""Save screenshots of the app: the first-run view, the library's fit badges on a simulated
4 GiB card and on a machine without a GPU, the main window, the load panel, a chat mid-stream,
a message with files attached, the dark theme.

    xvfb-run -a -s "-screen 0 1280x800x24" python tools/screenshots.py    # demo data
    xvfb-run -a python tools/screenshots.py --model-dir DIR   # chat with a real checkpoint

PNGs go to docs/screenshots/ (or --out). The window is 1280x800. With demo data the chat runs
the demo engine over a random Qwen3.5-4B-MLX-4bit checkpoint written into a throwaway
Hugging Face cache (2.3 GB in the temporary folder), which the library shows as downloaded.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop, QSettings

from app.context import build_context
from app.demo import DemoGpu, demo_context, demo_loader
from app.engine_bridge import LoadRequest
from app.main import make_app
from app.main_window import MainWindow
from engine.memory.speed import REFERENCE_CARDS
from engine.testing.documents import text_pdf

GIB = 1 << 30


class Card4GiB:
    """A 4 GiB laptop card with the desktop using 0.4 GiB (an NVML source)."""

    def open(self) -> None:
        pass

    def read(self) -> dict:
        used = int(0.4 * GIB)
        name = "NVIDIA GeForce RTX 3050 Laptop GPU (simulated 4 GiB)"
        speed = REFERENCE_CARDS["RTX 3050 Laptop 4GB"]
        return {
            "name": name,
            "total": 4 * GIB,
            "used": used,
            "free": 4 * GIB - used,
            "speed": speed,
            "capability": 86,  # sm_86: prefill attention runs fused
        }

    def close(self) -> None:
        pass


class NoGpu:
    """A machine without an NVIDIA driver (an NVML source that cannot open)."""

    def open(self) -> None:
        raise OSError("NVML Shared Library Not Found")

    def read(self) -> dict:
        raise AssertionError("not opened")

    def close(self) -> None:
        pass


def fresh_window(gpu_source) -> MainWindow:
    """A first start: settings and chats in a new folder, the demo engine."""
    base = Path(tempfile.mkdtemp(prefix="snug-shots-"))
    store = QSettings(str(base / "snug.ini"), QSettings.Format.IniFormat)
    ctx = build_context(
        store=store, chats_dir=base / "chats", loader=demo_loader(), gpu_source=gpu_source
    )
    window = MainWindow(ctx)
    window.resize(1280, 800)
    window.show()
    pump(3, until=lambda: ctx.machine.gpu is not None or bool(ctx.machine.no_gpu))
    return window


def settled(window: MainWindow) -> bool:
    """Every library badge and the welcome view have their verdicts."""
    cards = [window.library.card(e.key) for e in window.ctx.library.entries()]
    badges = all(c is None or not c.badge.text().startswith("Checking") for c in cards)
    return badges and not window.welcome.recommendation.pending and window.ctx.advisor.idle()


def first_run_shots(out: Path) -> None:
    window = fresh_window(DemoGpu)
    pump(30, until=lambda: settled(window))
    save(window, out / "first_run.png")
    window.close()
    for source, name in ((Card4GiB, "library_4gib.png"), (NoGpu, "library_cpu.png")):
        window = fresh_window(source)
        window.close_welcome()
        window.tabs.setCurrentWidget(window.library)
        window.library.select("qwen3.5-4b-4bit")
        pump(30, until=lambda w=window: settled(w))
        save(window, out / name)
        window.close()


def downloaded_4b(hub: Path) -> Path:
    """A Hugging Face cache at `hub` holding Qwen3.5-4B-MLX-4bit's snapshot as a download
    leaves it (a random checkpoint at the real shape, engine/testing/synth.py, 2.3 GB), so the
    library and the load panel show the model the demo chat runs as downloaded."""
    from engine.testing.synth import write_checkpoint
    from engine.testing.tiny import write_tokenizer

    revision = "0" * 40
    repo = hub / "models--mlx-community--Qwen3.5-4B-MLX-4bit"
    snapshot = repo / "snapshots" / revision
    write_checkpoint(snapshot, "4B", "mlx4", seed=1)
    write_tokenizer(snapshot)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


OLDER_CHATS = (  # title, days ago: earlier chats in the list, under their date headings
    ("Lisbon weekend itinerary", 1),
    ("Regex for ISO dates", 3),
    ("Sourdough starter schedule", 12),
    ("Explain Rust lifetimes", 40),
)


def older_chats(folder: Path) -> None:
    """Chats from earlier days, written as the app writes them, so the list shows its date
    headings."""
    import json

    from app.state.chat_history import Chat, Turn

    folder.mkdir(parents=True, exist_ok=True)
    for title, days in OLDER_CHATS:
        when = time.time() - days * 86400
        turns = [Turn("user", title), Turn("assistant", "(an earlier reply)")]
        chat = Chat(id=Chat.new().id, title=title, created=when, updated=when, turns=turns)
        (folder / f"{chat.id}.json").write_text(json.dumps(chat.to_dict()), encoding="utf-8")


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
    first_run_shots(out)
    base = Path(tempfile.mkdtemp(prefix="snug-shots-"))
    if args.model_dir:
        from app.engine_bridge import load_engine

        model_dir, loader, hub = args.model_dir, load_engine, None
    else:
        hub = str(base / "hub")
        model_dir, loader = str(downloaded_4b(Path(hub))), None
    older_chats(base / "chats")
    ctx = demo_context(base, delay=0.03, loader=loader, cache_dir=hub)
    ctx.settings.set("chat/thinking", True)
    window = MainWindow(ctx)
    window.resize(1280, 800)
    window.show()
    window.close_welcome()
    pump(1.5, until=lambda: len(ctx.machine.history) >= 3)

    s = ctx.settings
    ctx.engine.load(LoadRequest(model_dir, s.engine_settings(), s.context, s.streams, s.max_rows))
    pump(120, until=lambda: ctx.engine.state in ("ready", "empty"))

    # 1. Main window: a finished reply, the gauge with some history (a new chat: the app
    # opened on the newest of the older ones).
    ctx.chats.new_chat()
    ctx.chats.send("Why does a 4-bit model fit on my 8 GB laptop GPU?")
    pump(60, until=lambda: not ctx.chats.busy)
    pump(2.5)
    window.tabs.setCurrentWidget(window.library)
    pump(10, until=lambda: settled(window))
    save(window, out / "main_window.png")

    # 2. Load panel with a verdict, for a model that fits and one that does not.
    fits = ctx.library.find("qwen3.5-4b-4bit")
    window.choose(fits)
    pump(10, until=lambda: not window.load.badge.text().startswith("Checking"))
    save(window, out / "load_panel.png")
    window.choose(ctx.library.find("qwen3.5-9b-bf16"))
    pump(10, until=lambda: not window.load.badge.text().startswith("Checking"))
    save(window.load, out / "load_panel_does_not_fit.png")
    window.choose(fits)

    # 3. A chat mid-stream.
    ctx.chats.new_chat()
    ctx.chats.send("Explain the memory reserve setting.")
    pump(30, until=lambda: len(ctx.chats.current.turns[-1].content) > 420)
    save(window, out / "chat_streaming.png")
    ctx.chats.stop()
    pump(1.0, until=lambda: not ctx.chats.busy)

    # 4. Files attached: a sent message with two, and one waiting in the tray.
    notes = base / "meeting-notes.md"
    notes.write_text("# Launch\n- ship the 4 GiB build\n- test on a GTX 1650\n", encoding="utf-8")
    (base / "budget.pdf").write_bytes(text_pdf(["Q3 GPU budget: 2 laptops, 1 desktop"]))
    (base / "todo.txt").write_text("book the demo room\n", encoding="utf-8")
    ctx.chats.new_chat()
    window.chat.tray.add([str(notes), str(base / "budget.pdf")])
    pump(5, until=lambda: len(window.chat.tray.files) == 2)
    window.chat.input.setPlainText("What is left to do before the launch?")
    window.chat.send()
    pump(60, until=lambda: not ctx.chats.busy)
    window.chat.tray.add([str(base / "todo.txt")])
    pump(5, until=lambda: len(window.chat.tray.files) == 1)
    pump(0.5)
    save(window, out / "chat_attachments.png")

    # 5. The dark theme (Settings > Appearance), a reply with formulas.
    ctx.settings.set("app/theme", "dark")
    ctx.chats.new_chat()
    ctx.chats.send("Solve x² − 3x + 2 = 0")
    pump(60, until=lambda: not ctx.chats.busy)
    pump(1.0)
    save(window, out / "chat_dark.png")

    window.close()
    for path in sorted(out.glob("*.png")):
        print(path)
    app.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
