"""Lifelines: the server's end of each sandbox's stdin, held open for as long as the server lives.

A container made with a lifeline has its stdin open and closed once its one attached client goes (``OpenStdin``,
``StdinOnce``), and the server attaches to that stdin before the container starts. Its watchdog ends the container
when its stdin reaches end-of-file. So when the server goes, however it goes (its client closes its stdin, SIGTERM,
SIGKILL of the server or of its whole process group), the kernel closes the connection, the engine closes the
container's stdin, and the sandbox ends itself and is removed (``auto_remove``): nothing waits for the next server's
sweep. Over ssh the connection is the ssh client's, which ends with its parent or its pipe.
"""

from __future__ import annotations

import threading

from code_sandbox.docker_engine.failures import translate
from code_sandbox.docker_engine.sdk import Client, RawStream, attach_socket
from code_sandbox.docker_engine.streams import close_stream
from code_sandbox.errors import ErrorCode


class Lifelines:
    """The held stdin attachments of one engine object's containers, by container ID."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[object, RawStream]] = {}
        self._lock = threading.Lock()

    def hold(self, api: Client, container_id: str) -> None:
        """Attach to the (not yet started) container's stdin and keep the connection.

        :raises SandboxError: ``CONTAINER_START_FAILED`` when the engine refuses the attachment.
        """
        with translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
            attached: object = api.attach_socket(container_id, params={"stdin": 1, "stream": 1})
        with self._lock:
            self._held[container_id] = (attached, attach_socket(attached))

    def release(self, container_id: str) -> None:
        """Close the container's lifeline, if it has one here (its watchdog then ends it)."""
        with self._lock:
            held = self._held.pop(container_id, None)
        if held is not None:
            close_stream(*held)

    def release_all(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for attached, raw in held:
            close_stream(attached, raw)

    def __len__(self) -> int:
        return len(self._held)
