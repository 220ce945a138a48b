"""The engine as core sees it: every call that reaches a container, typed, and nothing of the SDK behind it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from code_sandbox.engine.models import (
    ContainerFacts,
    DaemonFacts,
    ExecResult,
    FileEntry,
    ImageFacts,
    RuntimeFacts,
    StoredSnapshot,
    Usage,
)
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import ContainerRequest

StderrSink = Callable[[bytes], None]
DEFAULT_MAX_STDERR = 1024 * 1024


@dataclass(frozen=True)
class ExecRequest:
    """A command to run in a container: no shell, no TTY, its output collected within ``timeout`` seconds.

    ``stdin`` chunks are streamed, then stdin is closed. Output past ``max_stdout``/``max_stderr`` fails the call;
    ``on_stderr`` gets stderr chunks as they come. ``exit_code=False`` skips asking for the exit code (a helper's
    one-line answer is judged alone); ``repeatable`` says that running the command twice does no harm (a query, a
    kill-all), so an engine that lost its output may run it again.
    """

    argv: Sequence[str]
    user: str
    timeout: float
    max_stdout: int
    max_stderr: int = DEFAULT_MAX_STDERR
    stdin: Iterable[bytes] | None = None
    on_stderr: StderrSink | None = None
    exit_code: bool = True
    repeatable: bool = False


@dataclass(frozen=True)
class LineRequest:
    """How to read one answer line from an :class:`ExecStream`: stderr on the way goes to ``on_stderr``; with
    ``until``, reading goes on after the line until ``until()`` is true, and stdout must stay silent meanwhile."""

    deadline: float
    max_stdout: int
    max_stderr: int
    on_stderr: StderrSink | None = None
    until: Callable[[], bool] | None = None


class NotStarted(SandboxError):
    """The runtime could not start a watched program (a loaded gVisor sandbox can refuse an exec): nothing of it ran,
    so it may be started again."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.TRANSFER_FAILED, "the program could not be started in the sandbox")


OutputSink = Callable[[int, bytes], None]
"""Gets a watched program's output as it comes: the stream (1 stdout, 2 stderr) and a piece of at most 64 KiB."""


@dataclass(frozen=True)
class WatchRequest:
    """A program run and watched by the engine alone, with nothing of ours beside it in the container: no stdin, no
    TTY, the fixed environment, ``/workspace`` as its directory.

    ``on_output`` gets every piece of both streams as it comes; nothing is kept. ``on_exit`` is called once, from
    another thread, as soon as the engine reports the process ended while its streams are still open (something it
    started holds them), so that the caller can end what is left. Reading stops at ``deadline`` (monotonic).
    """

    argv: Sequence[str]
    user: str
    deadline: float
    on_output: OutputSink
    on_exit: Callable[[], None]


class ExecStream(Protocol):
    """A process in a container with its stdin held open: requests go in, answers come back one line at a time.
    Used by one thread at a time, except that :meth:`close` may come from another thread and ends a read."""

    @property
    def closed(self) -> bool: ...

    def send(self, chunks: Iterable[bytes], deadline: float) -> None:
        """:raises SandboxError: ``TIMEOUT`` or ``TRANSFER_FAILED``."""
        ...

    def read_line(self, request: LineRequest) -> bytes:
        """The next line on stdout, without its newline.

        :raises SandboxError: ``TIMEOUT``; ``TRANSFER_FAILED`` when the stream ends, output passes a limit, or stdout
            carries anything after the line.
        """
        ...

    def close(self) -> None: ...


class Engine(Protocol):
    """A container engine: the only way core reaches containers. Every method blocks (async callers use worker
    threads) and every failure is a :class:`~code_sandbox.errors.SandboxError` in our words; the engine's own text
    travels only in its ``engine_text``, for the operator."""

    @property
    def timeout(self) -> int:
        """Seconds one engine call may take; a container may start this long after its create call began."""
        ...

    @property
    def labels(self) -> Mapping[str, str]:
        """Added to every container this engine creates (the operator's tag)."""
        ...

    @property
    def verified_images(self) -> set[tuple[str, str]]:
        """``(profile, image ID)`` pairs that passed verification on this engine object."""
        ...

    @property
    def location(self) -> str:
        """Where the engine is, safe to print and log (no user, password or query)."""
        ...

    def now(self) -> float:
        """The engine's time (seconds since the epoch): what expiry labels are written and judged in."""
        ...

    def close(self) -> None: ...

    def ping(self) -> None: ...

    def daemon_facts(self) -> DaemonFacts: ...

    def runtime_in_force(self) -> RuntimeFacts:
        """The runtime every container of this engine runs under.

        :raises SettingsError: the engine has no runtime of the name asked for.
        """
        ...

    def build_image(
        self, context: BinaryIO, *, tag: str, labels: Mapping[str, str], on_step: Callable[[str], None]
    ) -> str:
        """Build from an in-memory tar context; never pulls. Returns the image ID."""
        ...

    def image_facts(self, reference: str) -> ImageFacts | None:
        """A tag or ID resolved to the image's immutable ID and metadata; ``None`` when absent. Never pulls."""
        ...

    def image_annotations(self, image_id: str) -> tuple[str, ...]:
        """The image's annotations an engine passes to its runtime, as ``key=value`` (none on Docker)."""
        ...

    def create_container(
        self, request: ContainerRequest, *, start: bool = True, before_start: Callable[[str], None] | None = None
    ) -> str:
        """Create (and by default start) a hardened container; on any failure nothing is left behind.
        ``before_start`` gets the new ID between create and start; if it raises, the container is removed."""
        ...

    def signal_container(self, container_id: str, signal: str) -> None: ...

    def remove_container(self, container_id: str) -> bool:
        """Force-remove a container and what it holds; ``False`` when it was already gone."""
        ...

    def container_facts(self, container_id: str) -> ContainerFacts | None: ...

    def list_containers(self, label: str, *more_labels: str) -> list[ContainerFacts]:
        """Every container (running or not) that carries every label given (``key`` or ``key=value``)."""
        ...

    def usage(self, container_id: str) -> Usage | None:
        """The container's CPU and memory counters, read on the host; ``None`` where the engine has none."""
        ...

    def export_filesystem(self, container_id: str) -> Iterator[FileEntry]:
        """A created, not started, container's root filesystem, every regular file hashed."""
        ...

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        """Run a command in the container.

        :raises SandboxError: ``TIMEOUT``, ``TRANSFER_FAILED`` (the stream broke), ``CONTAINER_UNAVAILABLE``.
        """
        ...

    def watch_exec(self, container_id: str, request: WatchRequest) -> int | None:
        """Run a program and hand over its output until both streams end; return its exit code as the engine
        reports it (``None`` when the engine no longer knows the exec). A process killed by a signal ``n`` shows as
        ``128 + n``, like a process that exited with that code.

        :raises NotStarted: the runtime could not start it (then no output was handed on).
        :raises SandboxError: ``TIMEOUT`` past the deadline, ``TRANSFER_FAILED``, ``CONTAINER_UNAVAILABLE``.
        """
        ...

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> ExecStream:
        """Start ``argv`` in the container with its stdin held open (the helpers' channel). ``privileged``: with every
        capability of the runtime's own kernel, which only a user-space kernel (gVisor) may grant: the supervisor that
        jails each run (:mod:`code_sandbox.image.jail`).

        :raises SandboxError: ``CONTAINER_UNAVAILABLE``; ``INTERNAL_ERROR`` for ``privileged`` under any other runtime.
        """
        ...

    def remove_leftover_volumes(self, *, tag: str | None = None, grace: float) -> int:
        """Remove what sandboxes of ``tag``'s servers left outside their containers, older than ``grace`` seconds;
        returns how many could not be removed."""
        ...

    def store_snapshot(self, blob: bytes, labels: Mapping[str, str], tag: str) -> str:
        """Keep ``blob`` as an image of one file, with ``labels``, tagged ``tag`` in the snapshots' repository, made in
        one step: it exists whole or not at all. Returns its ID. A tag in use moves to it.

        :raises SandboxError: ``NOT_SUPPORTED`` when the engine did not keep the labels; ``SNAPSHOT_LIMIT_EXCEEDED``
            when it has no room; ``CONTAINER_UNAVAILABLE``.
        """
        ...

    def read_snapshot(self, snapshot_id: str, *, max_bytes: int) -> Iterator[bytes]:
        """The one file of a kept snapshot, at most ``max_bytes``, in pieces as the engine sends it; closing the
        iterator ends the read. Believed only once the iterator has ended without an error.

        :raises SandboxError: ``SNAPSHOT_NOT_FOUND`` (when called); ``SNAPSHOT_INVALID`` when the image is not one file
            within ``max_bytes``; ``CONTAINER_UNAVAILABLE``.
        """
        ...

    def find_snapshot(self, tag: str) -> StoredSnapshot | None:
        """The kept snapshot tagged ``tag``, if any (one engine request, however many images the engine holds)."""
        ...

    def list_snapshots(self, label: str) -> list[StoredSnapshot]:
        """Every kept snapshot that carries ``label`` (``key`` or ``key=value``), tagged or not. The engine lists
        every image it holds to answer: slow where it holds many."""
        ...

    def remove_snapshot(self, snapshot_id: str) -> bool:
        """Remove a kept snapshot; ``False`` when it was already gone."""
        ...
