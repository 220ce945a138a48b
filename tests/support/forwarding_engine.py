"""Engines that stand in front of another at the typed engine boundary, for faults no real engine shows on demand.

:class:`ForwardingEngine` passes every call of :class:`~code_sandbox.engine.Engine` on to the engine it wraps; a test
overrides the public calls it needs to slow down, fail or edit. :class:`EditedEngine` edits what helpers answer: the
answer line of a channel request of a given operation, or the result of an exec whose argv matches.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import BinaryIO, cast

from code_sandbox.engine import (
    ContainerFacts,
    DaemonFacts,
    Engine,
    ExecRequest,
    ExecResult,
    ExecStream,
    FileEntry,
    ImageFacts,
    LineRequest,
    RuntimeFacts,
    StderrSink,
    StoredSnapshot,
    Usage,
    WatchRequest,
)
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import ContainerRequest


class ForwardingEngine:
    """Every call goes to ``inner``."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner

    @property
    def timeout(self) -> int:
        return self.inner.timeout

    @property
    def labels(self) -> Mapping[str, str]:
        return self.inner.labels

    @property
    def verified_images(self) -> set[tuple[str, str]]:
        return self.inner.verified_images

    @property
    def location(self) -> str:
        return self.inner.location

    def now(self) -> float:
        return self.inner.now()

    def close(self) -> None:
        """The inner engine is the test's: it stays open."""

    def ping(self) -> None:
        self.inner.ping()

    def daemon_facts(self) -> DaemonFacts:
        return self.inner.daemon_facts()

    def runtime_in_force(self) -> RuntimeFacts:
        return self.inner.runtime_in_force()

    def build_image(
        self, context: BinaryIO, *, tag: str, labels: Mapping[str, str], on_step: Callable[[str], None]
    ) -> str:
        return self.inner.build_image(context, tag=tag, labels=labels, on_step=on_step)

    def image_facts(self, reference: str) -> ImageFacts | None:
        return self.inner.image_facts(reference)

    def image_annotations(self, image_id: str) -> tuple[str, ...]:
        return self.inner.image_annotations(image_id)

    def create_container(
        self, request: ContainerRequest, *, start: bool = True, before_start: Callable[[str], None] | None = None
    ) -> str:
        return self.inner.create_container(request, start=start, before_start=before_start)

    def signal_container(self, container_id: str, signal: str) -> None:
        self.inner.signal_container(container_id, signal)

    def remove_container(self, container_id: str) -> bool:
        return self.inner.remove_container(container_id)

    def container_facts(self, container_id: str) -> ContainerFacts | None:
        return self.inner.container_facts(container_id)

    def list_containers(self, label: str, *more_labels: str) -> list[ContainerFacts]:
        return self.inner.list_containers(label, *more_labels)

    def export_filesystem(self, container_id: str) -> Iterator[FileEntry]:
        return self.inner.export_filesystem(container_id)

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        return self.inner.exec(container_id, request)

    def watch_exec(self, container_id: str, request: WatchRequest) -> int | None:
        return self.inner.watch_exec(container_id, request)

    def usage(self, container_id: str) -> Usage | None:
        return self.inner.usage(container_id)

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> ExecStream:
        return self.inner.open_exec(container_id, argv, user=user, privileged=privileged)

    def remove_leftover_volumes(self, *, tag: str | None = None, grace: float) -> int:
        return self.inner.remove_leftover_volumes(tag=tag, grace=grace)

    def store_snapshot(self, blob: bytes, labels: Mapping[str, str], tag: str) -> str:
        return self.inner.store_snapshot(blob, labels, tag)

    def read_snapshot(self, snapshot_id: str, *, max_bytes: int) -> Iterator[bytes]:
        return self.inner.read_snapshot(snapshot_id, max_bytes=max_bytes)

    def find_snapshot(self, tag: str) -> StoredSnapshot | None:
        return self.inner.find_snapshot(tag)

    def list_snapshots(self, label: str) -> list[StoredSnapshot]:
        return self.inner.list_snapshots(label)

    def remove_snapshot(self, snapshot_id: str) -> bool:
        return self.inner.remove_snapshot(snapshot_id)


def innermost(engine: Engine) -> Engine:
    """The engine at the end of a chain of forwarding ones."""
    while isinstance(engine, ForwardingEngine):
        engine = engine.inner
    return engine


LineEdit = Callable[[bytes, StderrSink], bytes]
"""Gets a helper's answer line and a sink that adds stderr lines before the request's end marker; returns the line
the host is to see."""
ExecEdit = Callable[[list[str], ExecResult, StderrSink | None], ExecResult]
_END = b'{"end":true}\n'


class EditedEngine(ForwardingEngine):
    """The answer to every channel request of an operation in ``line_edits`` (``"run"``, ``"list"``...) is edited,
    and so is the result of every exec that ``exec_match`` accepts; ``operations`` records every channel request's
    operation."""

    def __init__(
        self,
        inner: Engine,
        *,
        line_edits: Mapping[str, LineEdit] | None = None,
        exec_match: Callable[[list[str]], bool] = lambda _argv: False,
        exec_edit: ExecEdit | None = None,
    ) -> None:
        super().__init__(inner)
        self.line_edits = dict(line_edits or {})
        self.exec_match = exec_match
        self.exec_edit = exec_edit
        self.operations: list[str] = []

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> ExecStream:
        return _EditedStream(self.inner.open_exec(container_id, argv, user=user, privileged=privileged), self)

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        result = super().exec(container_id, request)
        argv = list(request.argv)
        if self.exec_edit is not None and self.exec_match(argv):
            return self.exec_edit(argv, result, request.on_stderr)
        return result


class _EditedStream:
    """A channel whose answers to the edited operations are edited; the operation is read off each request."""

    def __init__(self, inner: ExecStream, engine: EditedEngine) -> None:
        self._inner = inner
        self._engine = engine
        self._operation: str | None = None

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def send(self, chunks: Iterable[bytes], deadline: float) -> None:
        chunks = list(chunks)
        self._operation = _operation_of(chunks[0]) if chunks else None
        if self._operation is not None:
            self._engine.operations.append(self._operation)
        self._inner.send(chunks, deadline)

    def read_line(self, request: LineRequest) -> bytes:
        edit = self._engine.line_edits.get(self._operation or "")
        if edit is None or request.until is None:
            return self._inner.read_line(request)
        # The request's stderr is held back until its end marker, so that lines the edit adds come before it.
        held = bytearray()
        line = self._inner.read_line(replace(request, on_stderr=held.extend, until=lambda: held.endswith(_END)))
        added: list[bytes] = []
        line = edit(line, added.append)
        if request.on_stderr is not None:
            for chunk in (bytes(held[: -len(_END)]), *added, _END):
                request.on_stderr(chunk)
        return line

    def close(self) -> None:
        self._inner.close()


def _operation_of(frame: bytes) -> str | None:
    """The ``op`` of a channel request's frame (4-byte length, then the JSON envelope); ``None`` for anything else."""
    if len(frame) < 4:
        return None
    (length,) = struct.unpack(">I", frame[:4])
    try:
        envelope: object = json.loads(frame[4 : 4 + length])
    except ValueError:
        return None
    operation = cast(dict[str, object], envelope).get("op") if isinstance(envelope, dict) else None
    return operation if isinstance(operation, str) else None


class EndlessEngine(ForwardingEngine):
    """Every held exec's end never arrives, as under gVisor once the container was removed (its attach stream can stay
    open until the call's deadline): a read that meets the end waits instead until the stream is closed (then it
    fails as a closed channel does) or until its deadline passes (a timeout)."""

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> ExecStream:
        return _EndlessStream(self.inner.open_exec(container_id, argv, user=user, privileged=privileged))


class _EndlessStream:
    def __init__(self, inner: ExecStream) -> None:
        self._inner = inner
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def send(self, chunks: Iterable[bytes], deadline: float) -> None:
        self._inner.send(chunks, deadline)

    def read_line(self, request: LineRequest) -> bytes:
        try:
            return self._inner.read_line(request)
        except SandboxError:
            if self._closed.wait(max(request.deadline - time.monotonic(), 0)):
                raise SandboxError(ErrorCode.TRANSFER_FAILED, "the channel to the sandbox closed") from None
            raise SandboxError(ErrorCode.TIMEOUT, "the sandbox helper did not answer in time") from None

    def close(self) -> None:
        self._closed.set()
        self._inner.close()
