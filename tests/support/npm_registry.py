"""An npm registry on loopback for the vendoring tests: serves the files a test puts at given paths, answers the
statuses or redirects a test sets, 404 to anything else, and records every request with its headers."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


class LoopbackRegistry:
    """``http://127.0.0.1:<port>``, serving until :meth:`close` (or the end of a ``with`` block)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.statuses: dict[str, int] = {}
        self.redirects: dict[str, str] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        """(path, headers with lowercased names) of every request, in order."""
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry.requests.append((self.path, {name.lower(): value for name, value in self.headers.items()}))
                if self.path in registry.redirects:
                    self.send_response(302)
                    self.send_header("Location", registry.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = registry.files.get(self.path)
                status = registry.statuses.get(self.path, 200 if body is not None else 404)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # pytest would show it as captured stderr

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def paths(self) -> list[str]:
        return [path for path, _headers in self.requests]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> LoopbackRegistry:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
