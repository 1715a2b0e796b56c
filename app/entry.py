"""`snug`: the GUI, or an engine subcommand (`snug chat`, `snug generate`, `snug plan`...)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

USAGE = "snug --smoke DIR [--screenshot PNG]"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    except KeyboardInterrupt:  # Ctrl+C while the engine's command line loads its modules
        sys.stderr.write("\nsnug: interrupted\n")
        return 130
    except BrokenPipeError:  # --help or --version piped into `head` and closed early
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(args: list[str]) -> int:
    if args and not args[0].startswith("-"):
        from engine.cli import main as cli_main  # the engine's CLI, imported only when asked

        return int(cli_main(args) or 0)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(
            "usage: snug [--demo]            start the desktop app\n"
            "       snug COMMAND [ARGS...]   run an engine command: chat, generate, serve, info,\n"
            "                                plan, cache (`snug COMMAND --help` for its flags)\n"
            f"       {USAGE}\n"
            "                                load DIR, answer one message, exit (checks a build)\n"
            "       snug --version           print the version and exit\n"
        )
        sys.stdout.flush()  # a closed pipe is said here, where main() answers it
        return 0
    if args and args[0] in ("-V", "--version"):
        sys.stdout.write(f"snug {version()}\n")
        sys.stdout.flush()
        return 0
    unusable = option_missing(args)
    if unusable:
        sys.stderr.write(f"snug: {unusable}\n")
        return 2
    missing = no_display_reason(os.environ, sys.platform)
    if missing:
        sys.stderr.write(f"snug: {missing}\n")
        return 2
    from app.main import main as gui_main

    return gui_main([sys.argv[0], *args])


def option_missing(args: list[str]) -> str | None:
    """Why `--smoke` or `--screenshot` cannot be used as given (its value left out, or
    another flag in its place), or None: the window would otherwise open for a check that
    never comes, or take the flag for the folder."""
    for name, what in (("--smoke", "the model folder to load"), ("--screenshot", "a PNG file")):
        if name in args:
            i = args.index(name)
            value = args[i + 1] if i + 1 < len(args) else ""
            if not value or value.startswith("-"):
                return f"{name} needs {what}: {USAGE}"
    return None


def version() -> str:
    """The installed package's version (its metadata; a bundle carries a copy)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("snug")
    except PackageNotFoundError:
        return "unknown (not installed: run `pip install -e .`)"


def no_display_reason(
    environ: Mapping[str, str],
    platform: str,
    reachable: Callable[[str], bool | None] = lambda d: x_reachable(d),
) -> str | None:
    """Why the window cannot open here (Linux without a display), or None. Qt itself would
    abort the process with a core dump instead of saying so."""
    if not platform.startswith("linux") or environ.get("QT_QPA_PLATFORM"):
        return None
    if environ.get("WAYLAND_DISPLAY"):
        return None
    display = environ.get("DISPLAY")
    if not display:
        return (
            "no display to open the window on (neither DISPLAY nor WAYLAND_DISPLAY is set). "
            "Start Snug from the desktop, use `xvfb-run snug`, or run a command such as "
            "`snug chat --model DIR` instead"
        )
    if reachable(display) is False:
        return (
            f"no X server answers at DISPLAY={display} (closed, or not this machine's). "
            "Start Snug from the desktop, check DISPLAY (or ssh -X), use `xvfb-run snug`, or "
            "run a command such as `snug chat --model DIR` instead"
        )
    return None


def x_reachable(display: str) -> bool | None:
    """Whether an X server answers at `display`, asked through libxcb (which Qt's X11
    plugin connects with: where it cannot, Qt aborts the process); None where libxcb is not
    there to ask (Qt then names the library it lacks). Qt has no call that tries a display
    without aborting, so the connection is made here, with ctypes."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("xcb")
    try:
        xcb = ctypes.CDLL(name) if name else None
    except OSError:
        xcb = None
    if xcb is None:
        return None
    xcb.xcb_connect.restype = ctypes.c_void_p
    xcb.xcb_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    xcb.xcb_connection_has_error.argtypes = [ctypes.c_void_p]
    xcb.xcb_disconnect.argtypes = [ctypes.c_void_p]
    connection = xcb.xcb_connect(display.encode(), None)  # an error object when it fails
    try:
        return xcb.xcb_connection_has_error(connection) == 0
    finally:
        xcb.xcb_disconnect(connection)


if __name__ == "__main__":
    sys.exit(main())
