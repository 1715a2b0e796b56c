"""`snug serve`: load a model and serve it over the OpenAI API.

    snug serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY]
               [--context N] [--streams N] [--queue N] [--batch-invariant on|off]

It listens on 127.0.0.1 unless told otherwise; any other address needs --api-key. With more
than one stream it decodes batch-invariant unless told otherwise (EngineSettings).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import socket
import sys

from engine.cli_plan import add_kv_cache_flag, gib_arg, int_at_least, with_kv_cache
from engine.config import ENV_BATCH_INVARIANT, EngineSettings, env_switch
from engine.errors import SnugError

__all__ = ["add_serve_parser", "run_serve"]


_positive, _count = int_at_least(1), int_at_least(0)


def _port(text: str) -> int:
    value = _count(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port: ports go from 0 to 65535")
    return value


def _host(text: str) -> str:
    """An address as people write it: an IPv6 one also in brackets, as in a URL ([::1])."""
    text = text.strip()
    return text[1:-1] if text.startswith("[") and text.endswith("]") else text


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` (port 0: a free one), to take before the model loads:
    an address that cannot be had is said at once, not after the load. uvicorn listens on
    it once the model is ready."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise SnugError(
            f"--host {host}: not an address or a name this machine resolves ({exc.strerror}); "
            "use an address of this machine such as 127.0.0.1 or 0.0.0.0"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = {
            errno.EADDRINUSE: "another program listens on that port: choose another with "
            "--port (0: any free one)",
            errno.EACCES: "ports below 1024 need administrator rights: choose one from 1024 "
            "with --port",
            errno.EADDRNOTAVAIL: f"{host} is not an address of this machine: change --host",
        }.get(exc.errno or 0, "change --host or --port")
        raise SnugError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); {hint}") from None
    sock.set_inheritable(True)
    return sock


def _url(host: str, sock: socket.socket) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{sock.getsockname()[1]}/v1"


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Register `serve` on an argparse subparsers object."""
    p = subparsers.add_parser("serve", help="serve a model over the OpenAI API (HTTP)")
    p.add_argument("--model", required=True, help="checkpoint folder (config.json, safetensors)")
    p.add_argument(
        "--host", type=_host, default="127.0.0.1", help="address to listen on (default 127.0.0.1)"
    )
    p.add_argument("--port", type=_port, default=8000, help="port (default 8000; 0: any free one)")
    p.add_argument(
        "--api-key",
        default=None,
        help="clients must send 'Authorization: Bearer KEY'; required with a --host other "
        "machines reach (any but a loopback address such as 127.0.0.1 or ::1)",
    )
    p.add_argument("--context", type=_positive, default=8192, help="tokens per stream")
    p.add_argument("--streams", type=_positive, default=4, help="requests decoded together")
    p.add_argument("--queue", type=_count, default=16, help="requests that may wait (0: none)")
    p.add_argument(
        "--max-rows", type=_positive, default=None, help="rows per forward (default: the plan's)"
    )
    p.add_argument("--prefill-chunk", type=_positive, default=None, help="prompt rows a step")
    p.add_argument(
        "--model-name",
        default=None,
        help="the id clients use (default: the folder's name, or the repository's for a "
        "Hugging Face cache snapshot)",
    )
    p.add_argument(
        "--backend",
        choices=["auto", "cuda", "numpy"],
        default=None,
        help="default: auto (env SNUG_BACKEND)",
    )
    p.add_argument("--reserve-gib", type=gib_arg, default=None, help="memory left for others")
    p.add_argument("--limit-gib", type=gib_arg, default=None, help="cap on what Snug holds")
    add_kv_cache_flag(p)
    p.add_argument(
        "--max-body-mib",
        type=_positive,
        default=None,
        help="largest request body, MiB (default 32: files sent in requests count)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a web page's origin that may call the server from a browser, e.g. "
        "https://chat.example.org ('*': any); pages on this machine always may",
    )
    p.add_argument(
        "--thinking-budget",
        type=_count,
        default=0,
        metavar="N",
        help="the most tokens a reply thinks where its request names no budget (0: no limit)",
    )
    p.add_argument(
        "--batch-invariant",
        choices=["on", "off"],
        default=None,
        help="a reply's tokens do not depend on the requests decoded beside it (default: on "
        f"with more than one stream; env {ENV_BATCH_INVARIANT}=0/1)",
    )
    return p


def with_batch_invariant(settings: EngineSettings, args: argparse.Namespace) -> EngineSettings:
    """The server's batch-invariant decode: --batch-invariant, else the environment's
    choice, else on where more than one stream is served (a request's reply then does not
    depend on the others in its decode steps)."""
    chosen = {"on": True, "off": False}.get(args.batch_invariant or "")
    if chosen is None:
        chosen = env_switch(ENV_BATCH_INVARIANT)
    if chosen is None:
        chosen = args.streams > 1
    return dataclasses.replace(settings, batch_invariant=chosen)


def run_serve(args: argparse.Namespace) -> int:
    from engine.cli_progress import context_note, cpu_note, load_progress
    from engine.scheduler import Scheduler
    from engine.server.app import MAX_BODY, create_app
    from engine.server.bind import check_bind
    from engine.server.runner import uvicorn_server
    from engine.session import Engine

    check_bind(args.host, args.api_key)  # before the (slow) load
    settings = EngineSettings.from_env().with_gib(reserve=args.reserve_gib, limit=args.limit_gib)
    if args.backend:
        settings = dataclasses.replace(settings, backend=args.backend)
    settings = with_batch_invariant(with_kv_cache(settings, args), args)
    sock = listen_socket(args.host, args.port)  # the address taken before the load too
    try:
        engine = Engine.load(
            args.model,
            settings,
            context=args.context,
            streams=args.streams,
            max_rows=args.max_rows,
            progress=load_progress(),
        )
    except BaseException:
        sock.close()
        raise
    cpu_note(engine, settings)
    context_note(engine, args.context)
    scheduler = Scheduler(engine, queue_size=args.queue, prefill_chunk=args.prefill_chunk)
    body = args.max_body_mib << 20 if args.max_body_mib else MAX_BODY
    app = create_app(
        scheduler.start(),
        model_id=args.model_name,
        api_key=args.api_key,
        max_body=body,
        cors_origins=args.cors_origin,
        thinking_budget=args.thinking_budget,
    )
    port = sock.getsockname()[1]
    server = uvicorn_server(app, args.host, port, log_level="info")
    sys.stderr.write(
        f"snug: serving {app.state.server.model_id} on {_url(args.host, sock)} "
        f"({engine.backend_name}, context {engine.context}, {engine.streams} streams, "
        f"queue {args.queue}, batch-invariant {'on' if settings.batch_invariant else 'off'}); "
        "Ctrl+C stops it\n"
    )
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn shut down cleanly on Ctrl+C, then raised it again
        sys.stderr.write("snug: the server stopped (Ctrl+C)\n")
        return 130
    finally:
        sock.close()
        scheduler.close()
        engine.unload()
    return 0
