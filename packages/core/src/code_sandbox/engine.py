"""The Docker adapter: the only module that imports the docker SDK.

It owns the client connection, image builds and inspection, container create/start/remove/list, filesystem
export, and the exec socket (stdin streaming, write-half close, frame demultiplexing, ``exec_inspect``). Every
Docker or transport failure leaves this module as a :class:`SandboxError` with our own message; daemon text,
container IDs and host paths never do. All methods block: async callers run them with ``anyio.to_thread``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, BinaryIO, cast

import docker
import docker.errors
import requests.exceptions
from docker.types import LogConfig, Ulimit

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    ENVIRONMENT,
    HOSTNAME,
    LABEL_RUNTIME,
    SUPERVISOR_USER,
    UNSEALED_ENVIRONMENT,
    WORKSPACE_DIR,
    ContainerRequest,
)
from code_sandbox.settings import Settings, SettingsError, env_name, unknown_runtime

logger = logging.getLogger(__name__)

_STDOUT, _STDERR = 1, 2
_TRANSPORT_ERRORS = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, socket.timeout)


@dataclass(frozen=True)
class DaemonFacts:
    """What core needs to know about the Docker daemon."""

    architecture: str
    os_type: str
    apparmor: bool
    seccomp: bool
    runtimes: Mapping[str, str] = field(default_factory=dict[str, str])
    """Every container runtime registered with the engine, by name, with the path of its binary as the engine
    reports it (``runc``: ``runc``; ``runsc``: ``/usr/bin/runsc``)."""
    default_runtime: str = "runc"


@dataclass(frozen=True)
class RuntimeFacts:
    """The container runtime that every container of an engine runs under."""

    name: str
    path: str
    """The runtime's binary as the engine reports it."""

    @property
    def user_space_kernel(self) -> bool:
        """Whether it is gVisor (``runsc``): a kernel in user space between sandboxed code and the host's kernel."""
        return PurePosixPath(self.path).name == "runsc"


@dataclass(frozen=True)
class ImageFacts:
    """An image resolved to its immutable ID."""

    id: str
    labels: Mapping[str, str]
    user: str
    architecture: str
    size: int


@dataclass(frozen=True)
class ContainerFacts:
    """A container as listed by the daemon. ``id`` never leaves core."""

    id: str
    labels: Mapping[str, str]
    state: str
    created: float | None


@dataclass(frozen=True)
class FileEntry:
    """One entry of an exported container filesystem."""

    path: str
    kind: str  # "file", "directory", "symlink", "other"
    mode: int
    uid: int
    sha256: str | None


@dataclass(frozen=True)
class ExecResult:
    """What an exec returned. ``stdout`` and ``stderr`` are bounded by the caller's limits."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes


def build_create_arguments(
    request: ContainerRequest, *, start: bool, runtime: RuntimeFacts
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The docker SDK arguments for a hardened container: ``create_container`` keywords and ``create_host_config``
    keywords. Every value comes from :mod:`code_sandbox.hardening` and the runtime in force; the benchmark's raw floor
    uses the same."""
    hardening = request.hardening
    host_config = {
        "runtime": runtime.name,
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": hardening.security_opt(apparmor=request.apparmor),
        "mem_limit": hardening.memory_bytes,
        "memswap_limit": hardening.memory_bytes,
        "nano_cpus": hardening.nano_cpus,
        "pids_limit": hardening.pids_limit,
        "init": True,
        "ulimits": [
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="nofile", soft=hardening.nofile, hard=hardening.nofile),
        ],
        "tmpfs": hardening.tmpfs(request.uid),
        "log_config": LogConfig(type="none"),
        "auto_remove": start,
        "privileged": False,
        "cgroupns": "private",
        "ipc_mode": "none",  # no /dev/shm: it would be writable memory outside the workspace quota
    }
    create = {
        "image": request.image_id,
        "command": request.command,
        "user": SUPERVISOR_USER,
        "environment": {**ENVIRONMENT, **(UNSEALED_ENVIRONMENT if runtime.user_space_kernel else {})},
        "labels": {**request.labels, LABEL_RUNTIME: runtime.name},
        "hostname": HOSTNAME,
        "network_disabled": True,
        "working_dir": WORKSPACE_DIR,
    }
    return create, host_config


def unavailable() -> SandboxError:
    return SandboxError(
        ErrorCode.CONTAINER_UNAVAILABLE,
        "the Docker engine is not reachable",
        hint="start Docker (Linux containers) and check that `docker info` works for this user",
    )


@contextlib.contextmanager
def _translate(code: ErrorCode, message: str) -> Generator[None]:
    """Turn any SDK or transport failure into our error; the original goes to the debug log by type only."""
    try:
        yield
    except SandboxError:
        raise
    except _TRANSPORT_ERRORS as exc:
        logger.debug("docker transport failure: %s", type(exc).__name__)
        raise unavailable() from None
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        logger.debug("docker call failed: %s", type(exc).__name__)
        if isinstance(exc, docker.errors.DockerException) and not isinstance(exc, docker.errors.APIError):
            raise unavailable() from None
        raise SandboxError(code, message) from None


class DockerEngine:
    """A lazily connected Docker client. Safe to share between threads (requests pools connections)."""

    def __init__(
        self,
        *,
        timeout: int = 60,
        labels: Mapping[str, str] | None = None,
        base_url: str | None = None,
        runtime: str | None = None,
    ) -> None:
        self.base_url = base_url
        """The daemon's address (``unix:///path/docker.sock``); ``None`` reads ``DOCKER_HOST`` and the rest of the
        environment, as the docker CLI does."""
        self.timeout = timeout
        """Seconds one API call may take; a container may start this long after its create call began."""
        self.labels: Mapping[str, str] = dict(labels or {})
        """Added to every container this engine creates (the ``CODE_SANDBOX_TAG`` setting; the tests' run label)."""
        self.runtime = runtime
        """The container runtime asked for (``CODE_SANDBOX_RUNTIME``); ``None`` is the engine's default. Every
        container this engine creates runs under :meth:`runtime_in_force`."""
        self.verified_images: set[tuple[str, str]] = set()
        """``(profile, image ID)`` pairs that passed ``verify_image`` on this engine. An image ID is a hash of the
        image's content, so a pass holds for as long as the ID exists; a retagged image has a new ID."""
        # Any, not docker.APIClient: the SDK's stubs leave many returns unknown, which strict pyright rejects
        # everywhere they flow. This module casts each answer to the shape it reads instead.
        self._api: Any = None
        self._lock = threading.Lock()
        self._daemon: DaemonFacts | None = None

    @classmethod
    def for_settings(cls, settings: Settings, **options: Any) -> DockerEngine:
        """The engine as the operator configured it: their tag on every container, their runtime for every one."""
        return cls(labels=settings.container_labels(), runtime=settings.runtime, **options)

    def is_local(self) -> bool:
        """Whether the engine is reached over a unix socket on this machine (its files are this machine's)."""
        address = self.base_url or os.environ.get("DOCKER_HOST") or "unix://"
        return address.startswith("unix://")

    def api(self) -> Any:
        with self._lock:
            if self._api is None:
                try:
                    client = (
                        docker.from_env(timeout=self.timeout)
                        if self.base_url is None
                        else docker.DockerClient(base_url=self.base_url, timeout=self.timeout)
                    )
                except (docker.errors.DockerException, *_TRANSPORT_ERRORS):
                    raise unavailable() from None
                self._api = client.api
            return self._api

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.close()
                self._api = None

    # -- daemon -------------------------------------------------------------------------------------------------

    def ping(self) -> None:
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine did not answer"):
            self.api().ping()

    def daemon_facts(self) -> DaemonFacts:
        if self._daemon is None:
            with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine did not describe itself"):
                info = cast(dict[str, Any], self.api().info())
            options = [str(option) for option in cast(list[object], info.get("SecurityOptions") or [])]
            runtimes = cast(dict[str, Any], info.get("Runtimes") or {})
            self._daemon = DaemonFacts(
                runtimes={
                    str(name): str(cast(dict[str, Any], value).get("path") or "") if isinstance(value, dict) else ""
                    for name, value in runtimes.items()
                },
                default_runtime=str(info.get("DefaultRuntime") or "runc"),
                architecture=_normalise_arch(str(info.get("Architecture", ""))),
                os_type=str(info.get("OSType", "")),
                apparmor=any(option.startswith("name=apparmor") for option in options),
                seccomp=any(
                    option.startswith("name=seccomp") and "profile=unconfined" not in option for option in options
                ),
            )
        return self._daemon

    def runtime_in_force(self) -> RuntimeFacts:
        """The runtime every container of this engine runs under: the one asked for, or the engine's default.

        :raises SettingsError: the engine has no runtime of the name asked for (the message names those it has).
        """
        daemon = self.daemon_facts()
        name = self.runtime or daemon.default_runtime
        if name not in daemon.runtimes:
            raise unknown_runtime(daemon.runtimes)
        return RuntimeFacts(name, daemon.runtimes[name])

    # -- images -------------------------------------------------------------------------------------------------

    def build_image(
        self, context: BinaryIO, *, tag: str, labels: Mapping[str, str], on_step: Callable[[str], None]
    ) -> str:
        """Build from an in-memory tar context (``custom_context``); never pulls. Returns the image ID."""
        image_id: str | None = None
        with _translate(ErrorCode.IMAGE_BUILD_FAILED, "the Docker engine could not build the image"):
            events = self.api().build(
                fileobj=context,
                custom_context=True,
                tag=tag,
                labels=dict(labels),
                pull=False,
                rm=True,
                forcerm=True,
                decode=True,
                timeout=600,
            )
            for event in cast(Iterable[dict[str, Any]], events):
                if "error" in event or "errorDetail" in event:
                    raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the Docker engine could not build the image")
                stream = str(event.get("stream", "")).strip()
                if stream.startswith("Step "):
                    on_step(stream.split(" :", 1)[0])
                aux = event.get("aux")
                if isinstance(aux, dict) and "ID" in aux:
                    image_id = str(cast(dict[str, Any], aux)["ID"])
        if image_id is None:
            facts = self.image_facts(tag)
            if facts is None:
                raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the Docker engine did not report the built image")
            image_id = facts.id
        return image_id

    def image_facts(self, reference: str) -> ImageFacts | None:
        """Resolve a tag or ID to the image's immutable ID and metadata; ``None`` when absent. Never pulls."""
        with _translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not inspect the image"):
            try:
                data = cast(dict[str, Any], self.api().inspect_image(reference))
            except docker.errors.ImageNotFound:
                return None
        config = cast(dict[str, Any], data.get("Config") or {})
        return ImageFacts(
            id=str(data["Id"]),
            labels={str(k): str(v) for k, v in cast(dict[str, Any], config.get("Labels") or {}).items()},
            user=str(config.get("User") or ""),
            architecture=_normalise_arch(str(data.get("Architecture", ""))),
            size=int(data.get("Size") or 0),
        )

    def untag_image(self, tag: str) -> None:
        """Remove one tag; the image itself stays while another tag or a container refers to it."""
        with (
            _translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not untag the image"),
            contextlib.suppress(docker.errors.ImageNotFound),
        ):
            self.api().remove_image(tag, force=False, noprune=True)

    def tag_image(self, image_id: str, tag: str) -> None:
        """Point ``tag`` (``repository:tag``) at an existing local image."""
        repository, _, name = tag.rpartition(":")
        with _translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not tag the image"):
            self.api().tag(image_id, repository, name, force=True)

    # -- containers ---------------------------------------------------------------------------------------------

    def create_container(
        self, request: ContainerRequest, *, start: bool = True, before_start: Callable[[str], None] | None = None
    ) -> str:
        """Create (and by default start) a hardened container; on any failure nothing is left behind.

        ``before_start`` is called with the new container's ID between create and start; if it raises, the
        container is removed and the error propagates (the uid collision check uses it).
        """
        api = self.api()
        container_id: str | None = None
        if self.labels:
            request = replace(request, labels={**request.labels, **self.labels})
        try:
            runtime = self.runtime_in_force()
        except SettingsError:  # the start-up check names the engine's runtimes; a tool's error does not
            raise SettingsError(
                env_name("runtime"), "names a runtime the Docker engine does not have (run `code-sandbox doctor`)"
            ) from None
        create_kwargs, host_kwargs = build_create_arguments(request, start=start, runtime=runtime)
        try:
            with _translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
                host_config = api.create_host_config(**host_kwargs)
                created = cast(dict[str, Any], api.create_container(**create_kwargs, host_config=host_config))
                container_id = str(created["Id"])
            if before_start is not None:
                before_start(container_id)
            if start:
                with _translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
                    api.start(container_id)
            return container_id
        except BaseException:
            if container_id is not None:
                with contextlib.suppress(SandboxError):
                    self.remove_container(container_id)
            raise

    def signal_container(self, container_id: str, signal: str) -> None:
        """Send a signal to the container's main process (docker-init forwards it to the watchdog)."""
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available"):
            try:
                self.api().kill(container_id, signal=signal)
            except docker.errors.APIError as exc:
                if exc.status_code in (404, 409):  # gone, or not running
                    raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone") from None
                raise

    def start_container(self, container_id: str) -> None:
        """Start a container created with ``start=False`` (it then does not remove itself)."""
        with _translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
            self.api().start(container_id)

    def remove_container(self, container_id: str) -> bool:
        """Force-remove a container. Returns ``False`` when Docker says it is already gone."""
        with _translate(ErrorCode.CONTAINER_REMOVAL_FAILED, "the sandbox container could not be removed"):
            try:
                self.api().remove_container(container_id, force=True)
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as exc:
                # 409 "removal already in progress": auto_remove is racing us. It counts as removed once Docker
                # no longer knows the container, which takes a moment.
                if exc.status_code != 409:
                    raise
                deadline = time.monotonic() + 5
                while self.container_facts(container_id) is not None:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
                return False
        return True

    def container_facts(self, container_id: str) -> ContainerFacts | None:
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not inspect a sandbox"):
            try:
                data = cast(dict[str, Any], self.api().inspect_container(container_id))
            except docker.errors.NotFound:
                return None
        config = cast(dict[str, Any], data.get("Config") or {})
        state = cast(dict[str, Any], data.get("State") or {})
        return ContainerFacts(
            id=str(data["Id"]),
            labels={str(k): str(v) for k, v in cast(dict[str, Any], config.get("Labels") or {}).items()},
            state=str(state.get("Status", "")),
            created=_parse_created(data.get("Created")),
        )

    def inspect_container_raw(self, container_id: str) -> dict[str, Any]:
        """The daemon's full inspect document, for snapshot tests and ``doctor``; never shown to clients."""
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not inspect a sandbox"):
            return cast(dict[str, Any], self.api().inspect_container(container_id))

    def list_containers(self, label: str, *more_labels: str) -> list[ContainerFacts]:
        """Every container (running or not) that carries every label given (``key`` or ``key=value``)."""
        filters = {"label": [label, *more_labels]}
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not list sandboxes"):
            rows = cast(list[dict[str, Any]], self.api().containers(all=True, filters=filters))
        return [
            ContainerFacts(
                id=str(row["Id"]),
                labels={str(k): str(v) for k, v in cast(dict[str, Any], row.get("Labels") or {}).items()},
                state=str(row.get("State", "")),
                created=float(row["Created"]) if isinstance(row.get("Created"), int | float) else None,
            )
            for row in rows
        ]

    def export_filesystem(self, container_id: str) -> Iterator[FileEntry]:
        """Stream a (created, not started) container's root filesystem, hashing every regular file."""
        with _translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not export the image filesystem"):
            stream = _ChunkReader(cast(Iterator[bytes], self.api().export(container_id)))
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for member in archive:
                    digest: str | None = None
                    if member.isfile():
                        extracted = archive.extractfile(member)
                        if extracted is not None:
                            digest = _sha256_of(extracted)
                    kind = (
                        "file"
                        if member.isfile()
                        else "directory"
                        if member.isdir()
                        else "symlink"
                        if member.issym() or member.islnk()
                        else "other"
                    )
                    yield FileEntry(
                        "/" + member.name.removeprefix("./").lstrip("/"), kind, member.mode & 0o7777, member.uid, digest
                    )

    # -- exec ---------------------------------------------------------------------------------------------------

    def exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        stdin: Iterable[bytes] | None = None,
        timeout: float,
        max_stdout: int,
        max_stderr: int = 1024 * 1024,
        on_stderr: Callable[[bytes], None] | None = None,
        exit_code: bool = True,
    ) -> ExecResult:
        """Run ``argv`` in the container (no shell, no TTY) and collect its output within ``timeout`` seconds.

        ``stdin`` chunks are streamed over the exec's attach socket, then its write half is closed. Output beyond
        ``max_stdout``/``max_stderr`` is a protocol violation (our helpers never produce it) and fails the call.
        ``on_stderr`` receives stderr chunks as they arrive (the runner's progress lines). ``exit_code=False``
        skips the ``exec_inspect`` round trip for callers that judge the output alone (the helpers' one-line answer).

        :raises SandboxError: ``TIMEOUT`` when the deadline passes, ``TRANSFER_FAILED`` when the stream breaks,
            ``CONTAINER_UNAVAILABLE`` when the container or daemon is gone.
        """
        deadline = time.monotonic() + timeout
        exec_id, attached, raw = self._start_exec(container_id, argv, user=user, stdin=stdin is not None)
        try:
            if stdin is not None:
                _send_all(raw, stdin, deadline)
                # Half-close tells the helper no more input comes. Only on a plain socket: on TLS it would end the
                # session layer, and a Windows named pipe closes entirely. Helpers read exact lengths anyway.
                if type(raw) is socket.socket:
                    with contextlib.suppress(OSError):
                        raw.shutdown(socket.SHUT_WR)
            stdout, stderr = _read_frames(raw, deadline, max_stdout, max_stderr, on_stderr)
        finally:
            # SocketIO.close() leaves the socket it wraps open; close both.
            with contextlib.suppress(OSError):
                attached.close()
            with contextlib.suppress(OSError):
                raw.close()
        code = self._exec_exit_code(exec_id, deadline) if exit_code else None
        return ExecResult(exit_code=code, stdout=stdout, stderr=stderr)

    def open_exec(self, container_id: str, argv: list[str], *, user: str) -> HeldExec:
        """Start ``argv`` in the container with its stdin held open: requests go in, answers come back one line at
        a time, for as long as the process lives (the helpers' channel).

        :raises SandboxError: ``CONTAINER_UNAVAILABLE`` when the container or daemon is gone.
        """
        _exec_id, attached, raw = self._start_exec(container_id, argv, user=user, stdin=True)
        return HeldExec(attached, raw)

    def _start_exec(
        self, container_id: str, argv: list[str], *, user: str, stdin: bool
    ) -> tuple[str, Any, socket.socket]:
        api = self.api()
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available"):
            try:
                exec_id = str(
                    cast(
                        dict[str, Any],
                        api.exec_create(
                            container_id,
                            argv,
                            stdout=True,
                            stderr=True,
                            stdin=stdin,
                            tty=False,
                            user=user,
                            environment=dict(ENVIRONMENT),
                            workdir=WORKSPACE_DIR,
                            privileged=False,
                        ),
                    )["Id"]
                )
            except docker.errors.NotFound:
                raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone") from None
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # container not running
                    raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone") from None
                raise
            attached = api.exec_start(exec_id, socket=True)
        return exec_id, attached, cast(socket.socket, getattr(attached, "_sock", attached))

    def _exec_exit_code(self, exec_id: str, deadline: float) -> int | None:
        # The attach stream can end a moment before the daemon records the exit; poll briefly.
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available"):
            while True:
                try:
                    info = cast(dict[str, Any], self.api().exec_inspect(exec_id))
                except docker.errors.NotFound:
                    return None
                if not info.get("Running"):
                    code = info.get("ExitCode")
                    return int(code) if isinstance(code, int) else None
                if time.monotonic() > deadline:
                    raise SandboxError(ErrorCode.TIMEOUT, "the sandbox helper did not finish in time")
                time.sleep(0.01)


def _send_all(raw: socket.socket, chunks: Iterable[bytes], deadline: float) -> None:
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                raw.settimeout(max(deadline - time.monotonic(), 0.001))
                sent = raw.send(view)
                view = view[sent:]
    except TimeoutError:
        raise SandboxError(ErrorCode.TIMEOUT, "sending files to the sandbox took too long") from None
    except Exception:  # OSError here; other transports (a Windows named pipe) raise their own types
        raise SandboxError(ErrorCode.TRANSFER_FAILED, "the transfer to the sandbox broke off") from None


def _recv_exact(raw: socket.socket, size: int, deadline: float) -> bytes | None:
    """Read exactly ``size`` bytes; ``None`` on a clean end of stream before the first byte."""
    parts: list[bytes] = []
    remaining = size
    while remaining:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxError(ErrorCode.TIMEOUT, "the sandbox helper did not answer in time")
        raw.settimeout(left)
        try:
            chunk = raw.recv(min(remaining, 1 << 20))
        except TimeoutError:
            raise SandboxError(ErrorCode.TIMEOUT, "the sandbox helper did not answer in time") from None
        except Exception:  # OSError here; other transports (a Windows named pipe) raise their own types
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the connection to the sandbox broke off") from None
        if not chunk:
            if remaining == size:
                return None
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the connection to the sandbox broke off")
        parts.append(chunk)
        remaining -= len(chunk)
    return b"".join(parts)


def _read_frames(
    raw: socket.socket,
    deadline: float,
    max_stdout: int,
    max_stderr: int,
    on_stderr: Callable[[bytes], None] | None,
) -> tuple[bytes, bytes]:
    """Demultiplex Docker's attach stream: 8-byte headers (stream id, 3 zero bytes, big-endian length)."""
    out = bytearray()
    err = bytearray()
    while True:
        header = _recv_exact(raw, 8, deadline)
        if header is None:
            return bytes(out), bytes(err)
        stream, length = struct.unpack(">BxxxL", header)
        target, limit = (out, max_stdout) if stream == _STDOUT else (err, max_stderr)
        # Check before reading: a bogus length must not make us buffer up to 4 GiB.
        if stream not in (_STDOUT, _STDERR) or len(target) + length > limit:
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the sandbox helper answered out of protocol")
        payload = _recv_exact(raw, length, deadline) if length else b""
        if payload is None:
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the connection to the sandbox broke off")
        target.extend(payload)
        if stream == _STDERR and on_stderr is not None:
            on_stderr(payload)


class HeldExec:
    """An exec's attach stream, held open: :meth:`send` writes to the process's stdin, :meth:`read_line` reads its
    output until stdout holds one whole line. Used by one thread at a time (the session's lease), except that
    :meth:`close` may come from another thread, which ends a read in progress."""

    def __init__(self, attached: Any, raw: socket.socket) -> None:
        self._attached = attached
        self._raw = raw
        self.closed = False

    def send(self, chunks: Iterable[bytes], deadline: float) -> None:
        """:raises SandboxError: ``TIMEOUT`` or ``TRANSFER_FAILED``."""
        _send_all(self._raw, chunks, deadline)

    def read_line(
        self,
        deadline: float,
        *,
        max_stdout: int,
        max_stderr: int,
        on_stderr: Callable[[bytes], None] | None,
        until: Callable[[], bool] | None = None,
    ) -> bytes:
        """The next line on stdout, without its newline; stderr on the way goes to ``on_stderr``. With ``until``,
        reading goes on after the line until ``until()`` is true (stderr can arrive after stdout: dockerd copies
        the two streams separately), and stdout must stay silent meanwhile.

        :raises SandboxError: ``TIMEOUT``; ``TRANSFER_FAILED`` when the stream ends, output passes a limit, or stdout
            carries anything after the line (one request, one line: more is out of protocol).
        """
        out = bytearray()
        err_bytes = 0
        while True:
            header = _recv_exact(self._raw, 8, deadline)
            if header is None:
                raise SandboxError(ErrorCode.TRANSFER_FAILED, "the channel to the sandbox closed")
            stream, length = struct.unpack(">BxxxL", header)
            if stream == _STDOUT and len(out) + length <= max_stdout:
                payload = _recv_exact(self._raw, length, deadline) if length else b""
                if payload is None:
                    raise SandboxError(ErrorCode.TRANSFER_FAILED, "the channel to the sandbox closed")
                out.extend(payload)
                end = out.find(b"\n")
                if end == -1:
                    continue
                if end != len(out) - 1:
                    raise SandboxError(ErrorCode.TRANSFER_FAILED, "the sandbox helper answered out of protocol")
                if until is None or until():
                    return bytes(out[:end])
                max_stdout = len(out)  # nothing more may come on stdout before the rest of stderr
                continue
            if stream == _STDERR and err_bytes + length <= max_stderr:
                payload = _recv_exact(self._raw, length, deadline) if length else b""
                if payload is None:
                    raise SandboxError(ErrorCode.TRANSFER_FAILED, "the channel to the sandbox closed")
                err_bytes += length
                if on_stderr is not None:
                    on_stderr(payload)
                if until is not None and out.endswith(b"\n") and until():
                    return bytes(out[:-1])
                continue
            raise SandboxError(ErrorCode.TRANSFER_FAILED, "the sandbox helper answered out of protocol")

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)  # wakes a read in another thread, which then sees the end
        for closable in (self._attached, self._raw):
            with contextlib.suppress(OSError):
                closable.close()


class _ChunkReader(io.RawIOBase):
    """A read-only file object over an iterator of byte chunks (the export stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


def _sha256_of(stream: BinaryIO | Any) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def _normalise_arch(name: str) -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


def _parse_created(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    # Docker gives RFC 3339 with nanoseconds, e.g. 2026-12-02T15:48:04.123456789Z.
    text = value.rstrip("Z")
    main, _, fraction = text.partition(".")
    try:
        parsed = datetime.fromisoformat(main + "+00:00")
    except ValueError:
        return None
    seconds = parsed.timestamp()
    if fraction.isdigit():
        seconds += float("0." + fraction[:6])
    return seconds
