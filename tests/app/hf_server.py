"""A tiny stand-in for the Hugging Face Hub's file endpoints, on 127.0.0.1.

Serves `/api/models/{repo}/revision/{rev}` (repo info with siblings) and
`/{repo}/resolve/{rev}/{file}` (HEAD with ETag / X-Repo-Commit / Content-Length, GET with
Range). `cut_once` names files whose first GET is cut off halfway through the body.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], cut_once: set[str] | None = None):
        self.repos = repos
        self.cut_once = set(cut_once or ())
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Range
        self.delay_s = 0.0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def ranges_for(self, filename: str) -> list[str | None]:
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + filename)]

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _lookup(self):
                m = re.match(r"^/api/models/(.+)/revision/([^/?]+)", self.path)
                if m:
                    return "info", m.group(1), None
                m = re.match(r"^/(.+?/.+?)/resolve/([^/]+)/(.+)$", self.path)
                if m:
                    return "file", m.group(1), m.group(3)
                return None, None, None

            def _not_found(self, code="RepoNotFound"):
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", "Repository not found")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self):  # noqa: N802
                self._serve(body=False)

            def do_GET(self):  # noqa: N802
                self._serve(body=True)

            def _serve(self, body: bool):
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                kind, repo, name = self._lookup()
                files = hub.repos.get(repo or "")
                if files is None:
                    return self._not_found()
                if kind == "info":
                    data = {
                        "id": repo,
                        "modelId": repo,
                        "sha": SHA,
                        "private": False,
                        "siblings": [
                            {"rfilename": n, "size": len(b), "blobId": _etag(b)}
                            for n, b in files.items()
                        ],
                    }
                    raw = json.dumps(data).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    if body:
                        self.wfile.write(raw)
                    return
                if name not in files:
                    return self._not_found("EntryNotFound")
                self._file(files[name], name, body)

            def _file(self, data: bytes, name: str, body: bool):
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                self.send_response(206 if rng else 200)
                self.send_header("ETag", f'"{_etag(data)}"')
                self.send_header("X-Repo-Commit", SHA)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                if name in hub.cut_once and not rng:
                    hub.cut_once.discard(name)
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                chunk = 64 << 10
                for i in range(start, len(data), chunk):
                    self.wfile.write(data[i : i + chunk])
                    if hub.delay_s:
                        import time

                        time.sleep(hub.delay_s)

        return Handler


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
