"""A TCP forwarder on loopback that a test can cut and mend: the network between a server and a remote engine,
failing for real (connections reset mid-stream, new ones closed at once) without touching the engine; or, in front of
a local engine's unix socket, a machine in the middle that speaks plain HTTP to it."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target`` (a port), or to the unix socket at ``target`` (a path).
    TLS passes through untouched. :attr:`connections` counts the connections it was offered."""

    def __init__(self, target: int | str) -> None:
        self.target = target
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Break every connection now and close each new one at once, until :meth:`mend`."""
        with self._lock:
            self._cut = True
            doomed, self._open = self._open, set()
        for sock in doomed:
            _close(sock)

    def mend(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)
        self._thread.join(timeout=5)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with self._lock:
                refused = self._cut
            if refused:
                _close(client)
                continue
            try:
                upstream = self._connect()
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _connect(self) -> socket.socket:
        if isinstance(self.target, int):
            return socket.create_connection(("127.0.0.1", self.target), timeout=5)
        upstream = socket.socket(socket.AF_UNIX)
        upstream.settimeout(5)
        try:
            upstream.connect(self.target)
        except OSError:
            upstream.close()
            raise
        return upstream

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open -= {source, sink}
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
