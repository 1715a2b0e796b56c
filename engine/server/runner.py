"""uvicorn serving the app on a thread of its own (the app's server switch, tests, the
benchmark). Where the server may listen is engine.server.bind's rule."""

from __future__ import annotations

import threading
import time
from typing import Any

import uvicorn

from engine.errors import SnugError


def uvicorn_config(app: Any, host: str, port: int, log_level: str = "warning") -> Any:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=3,
    )


class Server(uvicorn.Server):
    """uvicorn's server that, when it stops (Ctrl+C, `ServerThread.stop`), first ends the
    replies under way (`OpenAIServer.shutdown`: a 503 in each API's shape), so that their
    clients get a whole response at once rather than a connection cut after uvicorn's grace
    time."""

    async def shutdown(self, sockets: Any = None) -> None:
        owner = getattr(getattr(self.config.app, "state", None), "server", None)
        if owner is not None and hasattr(owner, "shutdown"):
            owner.shutdown()
        await super().shutdown(sockets)


def uvicorn_server(app: Any, host: str, port: int, log_level: str = "warning") -> Server:
    return Server(uvicorn_config(app, host, port, log_level))


class ServerThread:
    """`start()` returns once the server listens (port 0: a free port, read back in
    `port`); `stop()` ends it and waits for the thread."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self._server = uvicorn_server(app, host, port)
        self._thread = threading.Thread(target=self._serve, name="snug-http", daemon=True)

    def _serve(self) -> None:
        try:
            self._server.run()
        except SystemExit:  # uvicorn exits where it cannot listen (it has logged why)
            pass  # `start` sees the thread end before the server started, and says so

    @property
    def url(self) -> str:
        """The OpenAI base URL (`.../v1`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise SnugError(
                    f"the server could not listen on {self.host}:{self.port} (is the port in "
                    "use? choose another with --port)"
                )
            if time.monotonic() > deadline:
                raise SnugError(f"the server did not start within {timeout:.0f} s")
            time.sleep(0.01)
        if self.port == 0:
            self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and bool(self._server.started)
