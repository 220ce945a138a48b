"""What an engine reports and returns, as plain frozen data: the only shapes that cross the engine boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

from code_sandbox.hardening import JAIL_ARCHITECTURES

PODMAN = "Podman Engine"
""":attr:`DaemonFacts.product` of Podman's Docker-compatible API."""


@dataclass(frozen=True)
class DaemonFacts:
    """What core needs to know about the engine."""

    architecture: str
    os_type: str
    apparmor: bool
    seccomp: bool
    runtimes: Mapping[str, str] = field(default_factory=dict[str, str])
    """Every container runtime registered with the engine, by name, with the path of its binary as the engine
    reports it (``runc``: ``runc``; ``runsc``: ``/usr/bin/runsc``). On Podman, only the service's own: the one it runs
    every container under."""
    default_runtime: str = "runc"
    product: str = "Docker Engine"
    """What serves the API: ``Docker Engine``, or ``Podman Engine`` (asked of the engine, never guessed)."""
    version: str = ""
    operating_system: str = ""
    memory_bytes: int = 0
    """The engine host's memory (``MemTotal``; under Docker Desktop, its VM's); 0: not reported."""
    apparmor_profile: str | None = None
    """The AppArmor profile the engine's containers run under where the host has AppArmor: ours names Docker's
    ``docker-default``; Podman applies its own ``containers-default-*``. ``None``: not known."""

    @property
    def podman(self) -> bool:
        return self.product == PODMAN


TrustModel = Literal["sealed helpers", "jailed runs", "engine-only"]
TRUST_MODELS: Mapping[TrustModel, str] = {
    "sealed helpers": "sealed helpers: the host's kernel keeps user code out of the helpers that report on its runs",
    "jailed runs": "jailed runs: gVisor's kernel keeps user code out of a root channel, and each run sees its own "
    "processes alone",
    "engine-only": "engine-only: the engine reports each run, a supervisor out of user code's reach proves its end, "
    "and nothing of the sandbox's uid is believed",
}
"""Each trust model in a line, as ``verify-image`` and ``doctor`` name it."""


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

    def trust_model(self, *, jailed_runs: bool, architecture: str) -> TrustModel:
        """How the host knows what happened in a sandbox under this runtime (SECURITY.md): ``sealed helpers`` (the
        host kernel keeps user code out of helpers of its own uid, which report on a run); under gVisor, whose kernel
        does not, ``jailed runs`` for a profile whose runner jails (``jailed_runs``) on a machine the jail is written
        for (a root channel starts each run in a PID namespace of its own), else ``engine-only`` (the engine reports
        every run, and the supervisor uid proves its end)."""
        if not self.user_space_kernel:
            return "sealed helpers"
        return "jailed runs" if jailed_runs and normalise_arch(architecture) in JAIL_ARCHITECTURES else "engine-only"


@dataclass(frozen=True)
class ImageConfig:
    """How an image asks its containers to start, beyond its user and labels: what ``verify-image`` compares with what
    the build wrote. Absent, null and empty all read as empty."""

    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str = ""
    healthcheck: tuple[str, ...] = ()
    """The health check's test command; ``("NONE",)`` is an image that switched off an inherited one."""
    volumes: tuple[str, ...] = ()
    exposed_ports: tuple[str, ...] = ()
    on_build: tuple[str, ...] = ()
    stop_signal: str = ""
    shell: tuple[str, ...] = ()

    @property
    def env_names(self) -> tuple[str, ...]:
        return tuple(entry.partition("=")[0] for entry in self.env)


@dataclass(frozen=True)
class ImageFacts:
    """An image resolved to its immutable ID."""

    id: str
    labels: Mapping[str, str]
    user: str
    architecture: str
    size: int
    config: ImageConfig = field(default_factory=ImageConfig)


@dataclass(frozen=True)
class ContainerFacts:
    """A container as listed by the engine. ``id`` never leaves core."""

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
    gid: int = 0
    link: str = ""
    """A link's target (a hard link is a ``symlink`` here too, its target an image path)."""


@dataclass(frozen=True)
class Usage:
    """A container's resource counters as the engine reads them on the host (its cgroup): under gVisor, the only
    ones there are, covering gVisor's own kernel with the sandbox."""

    cpu_ns: int
    memory_bytes: int
    memory_peak_bytes: int | None
    """The cgroup's high-water mark since the container started, where the engine reports one (cgroup v1)."""


@dataclass(frozen=True)
class ExecResult:
    """What an exec returned. ``stdout`` and ``stderr`` are bounded by the caller's limits."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes


def normalise_arch(name: str) -> str:
    """An architecture as Docker's Go names (``amd64``) or the kernel's (``x86_64``) give it, in the kernel's."""
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


@dataclass(frozen=True)
class StoredSnapshot:
    """A snapshot as the engine keeps it: an image of one file, its labels as they are (nothing checked yet)."""

    id: str
    labels: Mapping[str, str]
    tags: tuple[str, ...] = ()
    """The tags it carries in the snapshots' repository: none when its tag moved to another snapshot."""
