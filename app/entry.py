"""`snug`: the GUI, or an engine subcommand (`snug generate`, `snug info`, `snug plan`...)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-"):
        from engine.cli import main as cli_main  # the engine's CLI, imported only when asked

        return int(cli_main(args) or 0)
    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(
            "usage: snug [--demo]            start the desktop app\n"
            "       snug COMMAND [ARGS...]   run an engine command (generate, info, plan, ...)\n"
        )
        return 0
    from app.main import main as gui_main

    return gui_main([sys.argv[0], *args])


if __name__ == "__main__":
    sys.exit(main())
