"""An engine in memory, behind the typed engine boundary, for the bookkeeping tests (sessions, leases, the pool,
sweeps, the reaper, errors): they run in milliseconds with no Docker engine.

A container is a record (labels, state, creation time); time is the test's clock; every call can be made to fail or
to wait with :meth:`MemoryEngine.fail` and :meth:`MemoryEngine.hold`, in the spirit of httpx's ``MockTransport``.
Execs are answered by :attr:`MemoryEngine.on_exec`, :attr:`MemoryEngine.on_watch_exec` and
:attr:`MemoryEngine.on_open_exec` (by default: the container is
not there), since what a helper says is :class:`~tests.support.memory_transport.MemoryTransport`'s to fake.
Anything that touches a real container is tested against the real engine, never here.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO, Literal

from code_sandbox.engine import (
    ContainerFacts,
    DaemonFacts,
    ExecRequest,
    ExecResult,
    ExecStream,
    FileEntry,
    ImageConfig,
    ImageFacts,
    RuntimeFacts,
    StoredSnapshot,
    Usage,
    WatchRequest,
)
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import ContainerRequest
from code_sandbox.profile import Profile

Call = Literal[
    "ping", "daemon_facts", "image_facts", "create_container", "start", "signal_container", "remove_container",
    "container_facts", "list_containers", "exec", "watch_exec", "open_exec",
]  # fmt: skip
DAEMON = DaemonFacts(architecture="x86_64", os_type="linux", apparmor=False, seccomp=True, runtimes={"runc": "runc"})


@dataclass
class MemoryContainer:
    id: str
    request: ContainerRequest
    labels: dict[str, str]
    created: float
    state: str = "created"
    signals: list[str] = field(default_factory=list[str])

    def facts(self) -> ContainerFacts:
        return ContainerFacts(self.id, dict(self.labels), self.state, self.created)


def gone() -> SandboxError:
    return SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone")


class MemoryEngine:
    """Containers in a dict. Safe to call from worker threads."""

    def __init__(
        self,
        *,
        daemon: DaemonFacts = DAEMON,
        clock: Callable[[], float] = time.time,
        labels: Mapping[str, str] | None = None,
        timeout: int = 60,
    ) -> None:
        self.daemon = daemon
        self.clock = clock
        self.timeout = timeout
        self.labels: Mapping[str, str] = dict(labels or {})
        self.verified_images: set[tuple[str, str]] = set()
        self.images: dict[str, ImageFacts] = {}
        self.containers: dict[str, MemoryContainer] = {}
        self.removed: list[str] = []
        """Every container removed, in order."""
        self.calls: list[Call] = []
        self.on_exec: Callable[[MemoryContainer, list[str], bytes], ExecResult] = _no_exec
        self.on_open_exec: Callable[[MemoryContainer, list[str]], ExecStream] = _no_open_exec
        self.on_watch_exec: Callable[[MemoryContainer, WatchRequest], int | None] = _no_watch_exec
        self._failures: dict[Call, list[BaseException]] = {}
        self._holds: dict[Call, threading.Event] = {}
        self.entered: dict[Call, threading.Event] = {}
        """Set when a held call has been entered."""
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.snapshots: dict[str, tuple[StoredSnapshot, bytes]] = {}
        """Kept snapshots by ID: what was stored, and its bytes."""

    location = "memory"

    def add_image(self, profile: Profile, *, image_id: str = "sha256:" + "0" * 64) -> ImageFacts:
        """The profile's image, as if built and already verified on this engine."""
        facts = ImageFacts(image_id, {}, "", self.daemon.architecture, 1, ImageConfig())
        self.images[profile.image_spec().tag] = self.images[image_id] = facts
        self.verified_images.add((profile.name, image_id))
        return facts

    def add_container(self, labels: Mapping[str, str], *, state: str = "running", created: float | None = None) -> str:
        """A container someone else made (another server, a crashed one)."""
        request = ContainerRequest("sha256:" + "0" * 64, ["watchdog"], dict(labels), apparmor=False)
        container = MemoryContainer(f"{next(self._ids):064x}", request, dict(labels), self.clock(), state)
        if created is not None:
            container.created = created
        with self._lock:
            self.containers[container.id] = container
        return container.id

    def fail(self, call: Call, error: BaseException, *, times: int = 1) -> None:
        """The next ``times`` calls of ``call`` raise ``error`` instead of doing anything."""
        self._failures.setdefault(call, []).extend([error] * times)

    def hold(self, call: Call) -> threading.Event:
        """Calls of ``call`` wait until the returned event is set (``entered[call]`` says one is waiting)."""
        self.entered[call] = threading.Event()
        self._holds[call] = threading.Event()
        return self._holds[call]

    def _enter(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)
        if call in self._holds:
            self.entered[call].set()
            if not self._holds[call].wait(30):
                raise SandboxError(ErrorCode.TIMEOUT, "the test never let the call go")
        with self._lock:
            failures = self._failures.get(call)
            failure = failures.pop(0) if failures else None
        if failure is not None:
            raise failure

    def _container(self, container_id: str) -> MemoryContainer:
        with self._lock:
            container = self.containers.get(container_id)
        if container is None:
            raise gone()
        return container

    # -- the engine ---------------------------------------------------------------------------------------------

    def now(self) -> float:
        return self.clock()

    def close(self) -> None:
        pass

    def ping(self) -> None:
        self._enter("ping")

    def daemon_facts(self) -> DaemonFacts:
        self._enter("daemon_facts")
        return self.daemon

    def runtime_in_force(self) -> RuntimeFacts:
        name = self.daemon.default_runtime
        return RuntimeFacts(name, self.daemon.runtimes[name])

    def build_image(
        self, context: BinaryIO, *, tag: str, labels: Mapping[str, str], on_step: Callable[[str], None]
    ) -> str:
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the memory engine builds no images")

    def image_facts(self, reference: str) -> ImageFacts | None:
        self._enter("image_facts")
        return self.images.get(reference)

    def image_annotations(self, image_id: str) -> tuple[str, ...]:
        return ()

    def create_container(
        self, request: ContainerRequest, *, start: bool = True, before_start: Callable[[str], None] | None = None
    ) -> str:
        self._enter("create_container")
        container = MemoryContainer(
            f"{next(self._ids):064x}", request, {**request.labels, **self.labels}, created=self.clock()
        )
        with self._lock:
            self.containers[container.id] = container
        try:
            if before_start is not None:
                before_start(container.id)
            if start:
                self._enter("start")
                container.state = "running"
        except BaseException:
            self.remove_container(container.id)
            raise
        return container.id

    def signal_container(self, container_id: str, signal: str) -> None:
        self._enter("signal_container")
        self._container(container_id).signals.append(signal)

    def remove_container(self, container_id: str) -> bool:
        self._enter("remove_container")
        with self._lock:
            removed = self.containers.pop(container_id, None)
            if removed is not None:
                self.removed.append(container_id)
        return removed is not None

    def container_facts(self, container_id: str) -> ContainerFacts | None:
        self._enter("container_facts")
        with self._lock:
            container = self.containers.get(container_id)
        return None if container is None else container.facts()

    def list_containers(self, label: str, *more_labels: str) -> list[ContainerFacts]:
        self._enter("list_containers")
        wanted = [
            (key, value if sep else None) for key, sep, value in (x.partition("=") for x in (label, *more_labels))
        ]
        with self._lock:
            containers = list(self.containers.values())
        return [
            container.facts()
            for container in containers
            if all(key in container.labels and value in (None, container.labels[key]) for key, value in wanted)
        ]

    def usage(self, container_id: str) -> Usage | None:
        return None

    def export_filesystem(self, container_id: str) -> Iterator[FileEntry]:
        raise SandboxError(ErrorCode.IMAGE_INVALID, "the memory engine exports nothing")

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        self._enter("exec")
        return self.on_exec(self._container(container_id), list(request.argv), b"".join(request.stdin or ()))

    def watch_exec(self, container_id: str, request: WatchRequest) -> int | None:
        self._enter("watch_exec")
        return self.on_watch_exec(self._container(container_id), request)

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> ExecStream:
        self._enter("open_exec")
        return self.on_open_exec(self._container(container_id), argv)

    def remove_leftover_volumes(self, *, tag: str | None = None, grace: float) -> int:
        return 0

    def store_snapshot(self, blob: bytes, labels: Mapping[str, str], tag: str) -> str:
        snapshot_id = f"sha256:{next(self._ids):064x}"
        with self._lock:
            for key, (stored, data) in list(self.snapshots.items()):  # the tag moves, as an engine's does
                self.snapshots[key] = (
                    (StoredSnapshot(stored.id, stored.labels, ()), data) if tag in stored.tags else (stored, data)
                )
            self.snapshots[snapshot_id] = (StoredSnapshot(snapshot_id, dict(labels), (tag,)), blob)
        return snapshot_id

    def read_snapshot(self, snapshot_id: str, *, max_bytes: int) -> Iterator[bytes]:
        with self._lock:
            if snapshot_id not in self.snapshots:
                raise SandboxError(ErrorCode.SNAPSHOT_NOT_FOUND, "no snapshot of that name exists")
            blob = self.snapshots[snapshot_id][1]
        if len(blob) > max_bytes:
            raise SandboxError(ErrorCode.SNAPSHOT_INVALID, "the snapshot is not as code-sandbox made it")
        return iter((blob,))

    def find_snapshot(self, tag: str) -> StoredSnapshot | None:
        with self._lock:
            return next((stored for stored, _blob in self.snapshots.values() if tag in stored.tags), None)

    def list_snapshots(self, label: str) -> list[StoredSnapshot]:
        key, _, value = label.partition("=")
        with self._lock:
            stored = [item for item, _blob in self.snapshots.values()]
        return [item for item in stored if key in item.labels and (not value or item.labels[key] == value)]

    def remove_snapshot(self, snapshot_id: str) -> bool:
        with self._lock:
            return self.snapshots.pop(snapshot_id, None) is not None


def _no_exec(_container: MemoryContainer, _argv: list[str], _stdin: bytes) -> ExecResult:
    raise gone()


def _no_watch_exec(_container: MemoryContainer, _request: WatchRequest) -> int | None:
    raise gone()


def _no_open_exec(_container: MemoryContainer, _argv: list[str]) -> ExecStream:
    raise gone()
