"""The Docker adapter's :class:`DockerEngine`: the :class:`~code_sandbox.engine.Engine` on the docker SDK, for Docker
and for Podman's Docker-compatible API."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import BinaryIO, Self

import docker.errors

from code_sandbox.docker_engine import podman, snapshots
from code_sandbox.docker_engine.address import EngineAddress
from code_sandbox.docker_engine.answers import (
    ContainerAnswer,
    ContainerRow,
    Created,
    ImageAnswer,
    InfoAnswer,
    StatsAnswer,
    VersionAnswer,
    parse_time,
)
from code_sandbox.docker_engine.arguments import build_create_arguments
from code_sandbox.docker_engine.execs import Execs
from code_sandbox.docker_engine.failures import (
    CONNECT_ERRORS,
    APIError,
    connection_failed,
    container_gone,
    translate,
)
from code_sandbox.docker_engine.images import follow_build, read_export
from code_sandbox.docker_engine.lifelines import Lifelines
from code_sandbox.docker_engine.sdk import Client, connect
from code_sandbox.docker_engine.streams import HeldExec
from code_sandbox.docker_engine.volumes import PodmanVolumes, TmpfsVolume, tmpfs_volumes
from code_sandbox.engine import (
    ContainerFacts,
    DaemonFacts,
    ExecRequest,
    ExecResult,
    FileEntry,
    ImageFacts,
    RuntimeFacts,
    StoredSnapshot,
    Usage,
    WatchRequest,
)
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_RUNTIME, ContainerRequest, environment
from code_sandbox.settings import Settings, SettingsError, env_name, unknown_runtime

logger = logging.getLogger(__name__)

_STARTING = (ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started")


class DockerEngine:
    """A lazily connected Docker client. Safe to share between threads (requests pools connections)."""

    def __init__(
        self,
        *,
        timeout: int = 60,
        labels: Mapping[str, str] | None = None,
        base_url: str | None = None,
        address: EngineAddress | None = None,
        runtime: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if base_url is not None:
            address = EngineAddress(base_url, "base_url")
        self._address = address
        self.wall_clock = wall_clock
        """This machine's clock: :meth:`now` while the engine's time is not known."""
        self.timeout = timeout
        self.labels: Mapping[str, str] = dict(labels or {})
        """Added to every container this engine creates (the ``CODE_SANDBOX_TAG`` setting; the tests' run label)."""
        self.runtime = runtime
        """The container runtime asked for (``CODE_SANDBOX_RUNTIME``); ``None`` is the engine's default. Every
        container this engine creates runs under :meth:`runtime_in_force`."""
        self.verified_images: set[tuple[str, str]] = set()
        """``(profile, image ID)`` pairs that passed ``verify_image`` on this engine. An image ID is a hash of the
        image's content, so a pass holds for as long as the ID exists; a retagged image has a new ID."""
        self._api: Client | None = None
        self._lock = threading.Lock()
        self._answered_version: VersionAnswer | None = None
        """The engine's answer to ``/version``, asked once when the client is made."""
        self._daemon: DaemonFacts | None = None
        self._clock_anchor: tuple[float, float] | None = None
        """The engine's time and this machine's monotonic clock at one moment: :meth:`now` counts on from there."""
        self._volumes = PodmanVolumes(self.client)
        self._execs = Execs(self.client, self._podman, self._exec_environment)
        self._seccomp_files: dict[str, str] = {}
        """Podman: the seccomp profile's file for each architecture, once checked or written."""
        self._lifelines = Lifelines()

    @classmethod
    def for_settings(cls, settings: Settings, *, timeout: int = 60) -> DockerEngine:
        """The engine as the operator configured it: their tag on every container, their runtime for every one."""
        return cls(labels=settings.container_labels(), runtime=settings.runtime, timeout=timeout)

    @property
    def address(self) -> EngineAddress:
        """Where the engine is; read from the environment on first use unless given.

        :raises SettingsError: the environment names an address or TLS set-up that cannot be used.
        """
        if self._address is None:
            self._address = EngineAddress.from_environment()
        return self._address

    @property
    def location(self) -> str:
        return self.address.shown()

    def client(self) -> Client:
        """The SDK's low-level client, connected on first use (tests and the benchmark reach the engine with it)."""
        with self._lock:
            if self._api is None:
                address = self.address
                address.require_checked()
                try:
                    self._api, self._answered_version = connect(address, self.timeout)
                except CONNECT_ERRORS as exc:
                    raise connection_failed(exc) from None
            return self._api

    def now(self) -> float:
        """The engine's time (seconds since the epoch): what expiry labels are written and judged in, so that
        servers on machines whose clocks differ agree on them. This machine's time while the engine is away."""
        with contextlib.suppress(SandboxError):
            self.daemon_facts()
        if self._clock_anchor is None:
            return self.wall_clock()
        engine_time, monotonic_time = self._clock_anchor
        return engine_time + (time.monotonic() - monotonic_time)  # a later step of this machine's clock is no matter

    def close(self) -> None:
        """Close the client, and every lifeline held: the containers made with one end themselves."""
        self._lifelines.release_all()
        with self._lock:
            if self._api is not None:
                self._api.close()
                self._api = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- daemon -------------------------------------------------------------------------------------------------

    def ping(self) -> None:
        with translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine did not answer"):
            self.client().ping()

    def daemon_facts(self) -> DaemonFacts:
        if self._daemon is None:
            with translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine did not describe itself"):
                api = self.client()
                started = time.monotonic()
                info = InfoAnswer.model_validate(api.info())
                ended = time.monotonic()
                engine_time = parse_time(info.SystemTime)
                if engine_time is not None:
                    # The engine read its clock somewhere within the call; its middle is off by at most half of it.
                    self._clock_anchor = (engine_time, (started + ended) / 2)
                version = self._answered_version or VersionAnswer(ApiVersion="")
                component = version.podman
                service_runtime = podman.service_runtime(api, component) if component is not None else None
            self._daemon = info.facts(version, service_runtime)
        return self._daemon

    def runtime_in_force(self) -> RuntimeFacts:
        """The runtime every container of this engine runs under: the one asked for, or the engine's default (on
        Podman, the service's own runtime, the only one it runs containers under).

        :raises SettingsError: the engine has no runtime of the name asked for (the message names those it has).
        """
        daemon = self.daemon_facts()
        name = self.runtime or daemon.default_runtime
        if daemon.podman and name != daemon.default_runtime:
            raise podman.ignores_runtime(daemon.default_runtime)
        if name not in daemon.runtimes:
            raise unknown_runtime(daemon.runtimes)
        return RuntimeFacts(name, daemon.runtimes[name])

    # -- images -------------------------------------------------------------------------------------------------

    def build_image(
        self, context: BinaryIO, *, tag: str, labels: Mapping[str, str], on_step: Callable[[str], None]
    ) -> str:
        """Build from an in-memory tar context (``custom_context``); never pulls. Returns the image ID."""
        with translate(ErrorCode.IMAGE_BUILD_FAILED, "the Docker engine could not build the image"):
            events = self.client().build(
                fileobj=context, custom_context=True, tag=tag, labels=dict(labels), pull=False, rm=True,
                forcerm=True, decode=True, timeout=600,
            )  # fmt: skip
            image_id = follow_build(events, on_step)
        if image_id is None:
            facts = self.image_facts(tag)
            if facts is None:
                raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the Docker engine did not report the built image")
            image_id = facts.id
        return image_id

    def image_facts(self, reference: str) -> ImageFacts | None:
        """Resolve a tag or ID to the image's immutable ID and metadata; ``None`` when absent. Never pulls."""
        with translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not inspect the image"):
            try:
                return ImageAnswer.model_validate(self.client().inspect_image(reference)).facts()
            except docker.errors.ImageNotFound:
                return None

    def image_annotations(self, image_id: str) -> tuple[str, ...]:
        """The image's OCI annotations (Podman only: Docker keeps none an image can set). Asked by verification
        only: :meth:`image_facts` runs at every create and does not ask."""
        if not self.daemon_facts().podman:
            return ()
        with translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not inspect the image"):
            return podman.image_annotations(self.client(), image_id)

    # -- containers ---------------------------------------------------------------------------------------------

    def create_container(
        self, request: ContainerRequest, *, start: bool = True, before_start: Callable[[str], None] | None = None
    ) -> str:
        """Create (and by default start) a hardened container; on any failure nothing is left behind.

        ``before_start`` is called with the new container's ID between create and start; if it raises, the
        container is removed and the error propagates (the uid collision check uses it).
        """
        api = self.client()
        if self.labels:
            request = replace(request, labels={**request.labels, **self.labels})
        try:
            runtime = self.runtime_in_force()
        except SettingsError:  # the start-up check names the engine's runtimes; a tool's error does not
            raise SettingsError(
                env_name("runtime"), "names a runtime the Docker engine does not have (run `code-sandbox doctor`)"
            ) from None
        daemon = self.daemon_facts()
        try:
            create_kwargs, host_kwargs = build_create_arguments(
                request, start=start, runtime=runtime, architecture=daemon.architecture
            )
        except ValueError:  # no seccomp profile for it (image builds refuse such engines first)
            raise SandboxError(
                ErrorCode.CONTAINER_START_FAILED, "sandboxes run on x86_64 and aarch64 engines only"
            ) from None
        volumes: list[TmpfsVolume] = tmpfs_volumes(request) if daemon.podman else []
        container_id: str | None = None
        try:
            if daemon.podman:
                self._volumes.create(volumes, {**request.labels, LABEL_RUNTIME: runtime.name})
                host_kwargs = podman.host_config(host_kwargs, request, volumes, self._seccomp_file(daemon), runtime)
            with translate(*_STARTING):
                try:
                    created = api.create_container(**create_kwargs, host_config=api.create_host_config(**host_kwargs))
                except APIError as exc:
                    if daemon.podman and (refusal := podman.create_refusal(exc)) is not None:
                        raise refusal from None
                    raise
                container_id = Created.model_validate(created).Id
            if volumes:
                self._volumes.adopt(container_id, volumes)
            if request.lifeline:
                self._lifelines.hold(api, container_id)
            if before_start is not None:
                before_start(container_id)
            if start:
                self._start(container_id, runtime)
            return container_id
        except BaseException:
            with contextlib.suppress(SandboxError):
                if container_id is not None:
                    self.remove_container(container_id)  # its lifeline too
                else:
                    self._volumes.remove(volume.name for volume in volumes)
            raise

    def _seccomp_file(self, daemon: DaemonFacts) -> str:
        known = self._seccomp_files.get(daemon.architecture)
        if known is None:  # checked or written once per engine object, not at every create
            known = podman.seccomp_file(daemon.architecture, local=self.address.local)
            self._seccomp_files[daemon.architecture] = known
        return known

    def signal_container(self, container_id: str, signal: str) -> None:
        """Send a signal to the container's main process (docker-init forwards it to the watchdog)."""
        with translate(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available"):
            try:
                self.client().kill(container_id, signal=signal)
            except APIError as exc:
                if podman.not_running(exc, self._podman()):
                    raise container_gone() from None
                raise

    def _start(self, container_id: str, runtime: RuntimeFacts) -> None:
        with translate(*_STARTING):
            try:
                self.client().start(container_id)
            except APIError as exc:
                if self._podman() and (refusal := podman.start_refusal(runtime, exc)) is not None:
                    raise refusal from None
                raise

    def remove_container(self, container_id: str) -> bool:
        """Force-remove a container (on Podman, and its tmpfs volumes). Returns ``False`` when Docker says it is
        already gone. Its lifeline, if this engine object holds one, is closed once it is removed."""
        if not self._podman():
            removed = self._remove_container(container_id)
            self._lifelines.release(container_id)
            return removed
        volumes = self._volumes.held_by(container_id)
        removed = self._remove_container(container_id)
        self._lifelines.release(container_id)
        self._volumes.remove(volumes)
        self._volumes.forget(container_id)
        return removed

    def _remove_container(self, container_id: str) -> bool:
        with translate(ErrorCode.CONTAINER_REMOVAL_FAILED, "the sandbox container could not be removed"):
            try:
                self.client().remove_container(container_id, force=True, v=True)
            except APIError as exc:
                if podman.gone(exc, self._podman()):
                    return False
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
        with translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not inspect a sandbox"):
            try:
                return ContainerAnswer.model_validate(self.client().inspect_container(container_id)).facts()
            except APIError as exc:
                if podman.gone(exc, self._podman()):
                    return None
                raise

    def list_containers(self, label: str, *more_labels: str) -> list[ContainerFacts]:
        """Every container (running or not) that carries every label given (``key`` or ``key=value``)."""
        filters = {"label": [label, *more_labels]}
        with translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not list sandboxes"):
            rows: Iterable[object] = self.client().containers(all=True, filters=filters)
            return [ContainerRow.model_validate(row).facts() for row in rows]

    def export_filesystem(self, container_id: str) -> Iterator[FileEntry]:
        """Stream a (created, not started) container's root filesystem, hashing every regular file."""
        with translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not export the image filesystem"):
            yield from read_export(self.client().export(container_id))

    def sandbox_volumes(self, *, tag: str | None = None, unused: bool = False) -> list[str]:
        """Podman: the names of the tmpfs volumes of managed sandboxes (of ``tag``'s servers, when given; ``unused``:
        only those no container uses); none elsewhere: no other engine gets volumes."""
        return [row.Name for row in self._volumes.listed(tag=tag, unused=unused)] if self._podman() else []

    def remove_leftover_volumes(self, *, tag: str | None = None, grace: float) -> int:
        """Podman: remove the sandbox volumes (of ``tag``'s servers, when given) that no container uses and that are
        older than ``grace`` seconds. Returns how many could not be removed."""
        if not self._podman():
            return 0
        return self._volumes.remove_leftovers(tag=tag, grace=grace, now=self.now)

    # -- snapshots ----------------------------------------------------------------------------------------------

    def store_snapshot(self, blob: bytes, labels: Mapping[str, str], tag: str) -> str:
        """See :meth:`code_sandbox.engine.Engine.store_snapshot` and :mod:`.snapshots`."""
        facts = self.daemon_facts()
        return snapshots.store(self.client(), blob, labels, tag, podman=facts.podman, architecture=facts.architecture)

    def find_snapshot(self, tag: str) -> StoredSnapshot | None:
        return snapshots.find(self.client(), tag)

    def read_snapshot(self, snapshot_id: str, *, max_bytes: int) -> Iterator[bytes]:
        return snapshots.read(self.client(), snapshot_id, max_bytes=max_bytes)

    def list_snapshots(self, label: str) -> list[StoredSnapshot]:
        return snapshots.listed(self.client(), label)

    def remove_snapshot(self, snapshot_id: str) -> bool:
        return snapshots.remove(self.client(), snapshot_id)

    # -- exec ---------------------------------------------------------------------------------------------------

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        """See :meth:`code_sandbox.engine.Engine.exec` and :meth:`Execs.run`."""
        return self._execs.run(container_id, request)

    def usage(self, container_id: str) -> Usage | None:
        """See :meth:`code_sandbox.engine.Engine.usage`: one sample of the engine's stats, without its second one."""
        with translate(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available"):
            answer = StatsAnswer.model_validate(self.client().stats(container_id, stream=False, one_shot=True))
        cpu = answer.cpu_stats.cpu_usage if answer.cpu_stats is not None else None
        memory = answer.memory_stats
        if cpu is None or memory is None or memory.usage is None:
            return None
        return Usage(cpu.total_usage, memory.usage, memory.max_usage)

    def watch_exec(self, container_id: str, request: WatchRequest) -> int | None:
        """See :meth:`code_sandbox.engine.Engine.watch_exec` and :meth:`Execs.watch`."""
        return self._execs.watch(container_id, request)

    def open_exec(self, container_id: str, argv: list[str], *, user: str, privileged: bool = False) -> HeldExec:
        """See :meth:`code_sandbox.engine.Engine.open_exec` and :meth:`Execs.open`. A privileged exec under the host's
        kernel would be root on the host: it is refused unless every container of this engine runs under a user-space
        kernel, on Docker (Podman ignores the runtime asked for)."""
        if privileged and (self._podman() or not self.runtime_in_force().user_space_kernel):
            raise SandboxError(ErrorCode.INTERNAL_ERROR, "a privileged helper runs only under a user-space kernel")
        return self._execs.open(container_id, argv, user=user, privileged=privileged)

    def _podman(self) -> bool:
        return self.daemon_facts().podman

    def _exec_environment(self) -> dict[str, str]:
        try:
            gvisor = self.runtime_in_force().user_space_kernel
        except SettingsError:  # no such runtime: no container runs to exec in
            gvisor = False
        return environment(user_space_kernel=gvisor)
