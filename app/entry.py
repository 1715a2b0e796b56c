"""`snug`: the GUI, or an engine subcommand (`snug chat`, `snug generate`, `snug plan`...)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-"):
        from engine.cli import main as cli_main  # the engine's CLI, imported only when asked

        return int(cli_main(args) or 0)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(
            "usage: snug [--demo]            start the desktop app\n"
            "       snug COMMAND [ARGS...]   run an engine command: chat, generate, serve, info,\n"
            "                                plan, cache (`snug COMMAND --help` for its flags)\n"
            "       snug --smoke DIR [--screenshot PNG]\n"
            "                                load DIR, answer one message, exit (checks a build)\n"
            "       snug --version           print the version and exit\n"
        )
        return 0
    if args and args[0] in ("-V", "--version"):
        sys.stdout.write(f"snug {version()}\n")
        return 0
    missing = no_display_reason(os.environ, sys.platform)
    if missing:
        sys.stderr.write(f"snug: {missing}\n")
        return 2
    from app.main import main as gui_main

    return gui_main([sys.argv[0], *args])


def version() -> str:
    """The installed package's version (its metadata; a bundle carries a copy)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("snug")
    except PackageNotFoundError:
        return "unknown (not installed: run `pip install -e .`)"


def no_display_reason(environ: Mapping[str, str], platform: str) -> str | None:
    """Why the window cannot open here (Linux without a display), or None. Qt itself would
    abort the process with a core dump instead of saying so."""
    if not platform.startswith("linux") or environ.get("QT_QPA_PLATFORM"):
        return None
    if environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"):
        return None
    return (
        "no display to open the window on (neither DISPLAY nor WAYLAND_DISPLAY is set). "
        "Start Snug from the desktop, use `xvfb-run snug`, or run a command such as "
        "`snug chat --model DIR` instead"
    )


if __name__ == "__main__":
    sys.exit(main())
