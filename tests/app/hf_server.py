"""A tiny stand-in for the Hugging Face Hub's file endpoints, on 127.0.0.1 only.

Serves `/api/models/{repo}/revision/{rev}` (repo info with siblings) and
`/{repo}/resolve/{rev}/{file}` (HEAD with ETag / X-Repo-Commit / Content-Length, GET with
Range), with the Hub's hashes: `*.safetensors` files are LFS (the listing's `lfs.sha256`
and the ETag are the content's sha256), other files carry their git blob sha1.

It can also misbehave, one switch per lie (set them after construction):
    cut_once      names whose first GET is cut off halfway (Content-Length says all)
    short_once    names whose first GET is an honest but short body (half the bytes)
    corrupt_once  names whose first GET has the right size but flipped bytes
    etags         name -> the ETag to send instead of the real hash
    listed        name -> fields that replace the listing's (e.g. {"size": 0})
    extra         more siblings for the listing, as raw dicts
    sha           the commit the listing names
    stall_s       a pause before each GET body (widens races between two clients)
    info_stall_s  a pause before the repo info answers (a Hub that stops answering)
    refuse        repo -> (status, X-Error-Code) for its files: 401 GatedRepo, 403 ...
    cdn_ttl_s     LFS files redirect to a signed link on another host (localhost) that
                  answers 403 once it is this many seconds old, as the Hub's CDN links do
It answers at most `max_requests` requests (then 503) and shuts itself down after
`lifetime_s`, so a test that forgets it cannot leave it running.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SHA = "0123456789abcdef0123456789abcdef01234567"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_lfs(name: str) -> bool:
    return name.endswith(".safetensors")


def content_etag(name: str, data: bytes) -> str:
    """The hash the Hub sends as ETag: sha256 for LFS files, the git blob sha1 otherwise."""
    return hashlib.sha256(data).hexdigest() if is_lfs(name) else git_blob_sha1(data)


class FakeHub:
    def __init__(
        self,
        repos: dict[str, dict[str, bytes]],
        cut_once: set[str] | None = None,
        max_requests: int = 2000,
        lifetime_s: float = 120.0,
    ):
        self.repos = repos
        self.cut_once = set(cut_once or ())
        self.short_once: set[str] = set()
        self.corrupt_once: set[str] = set()
        self.etags: dict[str, str] = {}
        self.listed: dict[str, dict] = {}
        self.extra: list[dict] = []
        self.sha = SHA
        self.stall_s = 0.0
        self.delay_s = 0.0
        self.info_stall_s = 0.0
        self.refuse: dict[str, tuple[int, str]] = {}
        self.cdn_ttl_s: float | None = None
        self.max_requests = max_requests
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Range
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime_s, self._stop)
        self._timer.daemon = True
        self._stopped = False

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self._stop()

    def _stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._server.shutdown()
        self._server.server_close()

    def ranges_for(self, filename: str) -> list[str | None]:
        return [r for m, p, r in self.requests if m == "GET" and p.endswith("/" + filename)]

    def _take(self, switch: set[str], name: str) -> bool:
        with self._lock:
            hit = name in switch
            switch.discard(name)
            return hit

    def _sibling(self, name: str, data: bytes) -> dict:
        entry: dict = {"rfilename": name, "size": len(data), "blobId": git_blob_sha1(data)}
        if is_lfs(name):
            oid = content_etag(name, data)
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\n"
            entry["blobId"] = git_blob_sha1(pointer.encode())
            entry["lfs"] = {
                "sha256": oid,
                "size": len(data),
                "pointerSize": len(pointer),
            }
        entry.update(self.listed.get(name, {}))
        return entry

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # an idle client cannot hold a server thread for long

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

            def _empty(self, code: int, headers: dict[str, str]):
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _not_found(self, code="RepoNotFound"):
                self._empty(404, {"X-Error-Code": code, "X-Error-Message": "Not found"})

            def do_HEAD(self):  # noqa: N802
                self._serve(body=False)

            def do_GET(self):  # noqa: N802
                self._serve(body=True)

            def _serve(self, body: bool):
                with hub._lock:
                    hub.requests.append((self.command, self.path, self.headers.get("Range")))
                    over = len(hub.requests) > hub.max_requests
                if over:
                    return self._empty(503, {})
                m = re.match(r"^/cdn/([0-9.]+)/(.+?/.+?)/(.+)$", self.path)
                if m:  # a signed link: good until its deadline
                    files = hub.repos.get(m.group(2), {})
                    if time.time() > float(m.group(1)) or m.group(3) not in files:
                        return self._empty(403, {})
                    return self._file(files[m.group(3)], m.group(3), body)
                kind, repo, name = self._lookup()
                files = hub.repos.get(repo or "")
                if files is None:
                    return self._not_found()
                if kind == "info":
                    if hub.info_stall_s:
                        time.sleep(hub.info_stall_s)
                    siblings = [hub._sibling(n, b) for n, b in files.items()] + hub.extra
                    data = {"id": repo, "modelId": repo, "sha": hub.sha, "private": False}
                    raw = json.dumps({**data, "siblings": siblings}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    if body:
                        self.wfile.write(raw)
                    return
                if repo in hub.refuse:
                    status, code = hub.refuse[repo]
                    return self._empty(status, {"X-Error-Code": code, "X-Error-Message": code})
                if name not in files:
                    return self._not_found("EntryNotFound")
                if hub.cdn_ttl_s is not None and is_lfs(name):
                    return self._redirect(files[name], repo, name)
                self._file(files[name], name, body)

            def _redirect(self, data: bytes, repo: str, name: str):
                port = hub._server.server_address[1]
                deadline = time.time() + hub.cdn_ttl_s
                where = f"http://localhost:{port}/cdn/{deadline:.3f}/{repo}/{name}"
                etag = hub.etags.get(name, content_etag(name, data))
                self._empty(
                    302,
                    {
                        "Location": where,
                        "X-Linked-Etag": f'"{etag}"',
                        "X-Linked-Size": str(len(data)),
                        "X-Repo-Commit": hub.sha,
                    },
                )

            def _file(self, data: bytes, name: str, body: bool):
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                short = body and hub._take(hub.short_once, name)
                end = start + (len(data) - start) // 2 if short else len(data)
                self.send_response(206 if rng else 200)
                self.send_header("ETag", f'"{hub.etags.get(name, content_etag(name, data))}"')
                self.send_header("X-Repo-Commit", hub.sha)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(end - start))
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if not body:
                    return
                if hub.stall_s:
                    time.sleep(hub.stall_s)
                if hub._take(hub.corrupt_once, name):
                    data = data.translate(bytes(range(255, -1, -1)))  # every bit flipped
                if not rng and hub._take(hub.cut_once, name):
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                chunk = 64 << 10
                for i in range(start, end, chunk):
                    self.wfile.write(data[i : min(i + chunk, end)])
                    if hub.delay_s:
                        time.sleep(hub.delay_s)

        return Handler
