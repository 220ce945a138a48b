"""The Docker adapter: the only module that imports the docker SDK.

It owns the client connection, image builds and inspection, container create/start/remove/list, filesystem
export, and the exec socket (stdin streaming, write-half close, frame demultiplexing, ``exec_inspect``). Every
Docker or transport failure leaves this module as a :class:`SandboxError` with our own message; daemon text,
container IDs and host paths never do, except in its ``engine_text``: what the engine said, bounded and escaped, for
the operator alone. All methods block: async callers run them with ``anyio.to_thread``.

The engine may be Podman's Docker-compatible API (as tested: rootful Podman 4.3; asked of the engine,
:attr:`DaemonFacts.product`). It takes the same arguments with these differences, each handled in this module's
Podman sections and nowhere else:

- Its tmpfs mounts refuse ``nr_inodes``, ``uid`` and ``gid``, so each tmpfs mount of a sandbox is a tmpfs volume of the
  local driver, of its own, with the same options (``size`` as ``nr_blocks`` of 4 KiB pages, since Podman reads
  ``size`` as a disk quota: on a kernel with larger pages the bound grows with them), bound
  ``noexec,nosuid,nodev,nocopy``. Named volumes outlive their container: they are removed with it, and a sweep removes
  those that no container uses (a container that removed itself, a crash).
- It adds ``/run`` and ``/var/tmp`` as writable tmpfs mounts of unbounded size; they are mounted read-only and 4 KiB
  instead, without the image's content (``notmpcopyup``).
- Rootful, it asks for an RLIMIT_NPROC of 1048576 unless given one, which fails every start where the service lacks
  CAP_SYS_RESOURCE; :data:`PODMAN_NPROC` is given.
- It ignores the runtime asked for and runs every container under the service's own OCI runtime, while its info lists
  runtimes that may not even be installed: that runtime is the only one it has here, none is asked for, and a
  ``CODE_SANDBOX_RUNTIME`` naming another is refused (:func:`podman_ignores_runtime`). Where that runtime cannot run
  (crun on hybrid cgroups), every start fails with "OCI runtime error": :func:`runtime_cannot_start` names the fix.
- It ignores ``cgroupns: private``: a sandbox sees the host's cgroup paths in ``/proc/self/cgroup``.
- Its AppArmor profile is ``containers-default-*``, not ``docker-default``: none is named, so Podman applies its own.
- ``init`` needs catatonit; without it every create fails (:func:`_no_catatonit`).
- A kill or exec on a stopped container fails with 500 "container state improper", not 409; an inspect, kill or
  removal of a container it is removing fails with 500 "... no such container", not 404 (:meth:`DockerEngine._gone`).
- It adds ``TERM`` and ``container=podman`` to the environment, and an exec that has not started inspects as exited
  with code 0 (Docker: null); neither matters here.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import secrets
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, BinaryIO, Self, cast
from urllib.parse import urlsplit

import docker
import docker.constants
import docker.errors
import paramiko
import requests.exceptions
from docker.context import ContextAPI
from docker.context.config import get_current_context_name
from docker.tls import TLSConfig
from docker.types import LogConfig, Ulimit

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    ENVIRONMENT,
    HOSTNAME,
    LABEL_MANAGED,
    LABEL_RUNTIME,
    LABEL_TAG,
    SEALED_DIRS,
    SEALED_TMPFS,
    SUPERVISOR_USER,
    UNSEALED_ENVIRONMENT,
    WORKSPACE_DIR,
    ContainerRequest,
)
from code_sandbox.liveness import default_state_dir
from code_sandbox.seccomp import profile_text
from code_sandbox.settings import Settings, SettingsError, env_name, is_runtime_name, unknown_runtime

logger = logging.getLogger(__name__)

_STDOUT, _STDERR = 1, 2
_TRANSPORT_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    ConnectionError,
    socket.timeout,
    paramiko.SSHException,  # ssh:// engines
)


_TLS_FILES = ("ca.pem", "cert.pem", "key.pem")
PODMAN = "Podman Engine"
PODMAN_LOST_OUTPUT_RETRIES = 2
"""How often a repeatable exec whose output Podman lost runs again (measured on Podman 4.3.1 under load: 6 of 60 short
runtime-version execs came back with exit 0 and no output)."""


@dataclass(frozen=True)
class EngineAddress:
    """Where the engine listens and how to reach it, worked out as the docker CLI does: ``DOCKER_HOST`` (with
    ``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH``), else the Docker context in use (``DOCKER_CONTEXT``, else the
    CLI configuration's current context), else the local socket."""

    url: str | None
    """``unix://``, ``tcp://`` or ``npipe://``; ``None`` is the platform's default socket."""
    origin: str
    """Where the address came from, for ``doctor``: ``DOCKER_HOST``, ``Docker context NAME``, ``default``."""
    tls: TLSConfig | None = None
    tls_verify: bool = False
    """Whether the engine's certificate is checked against a CA (``DOCKER_TLS_VERIFY``)."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> EngineAddress:
        """:raises SettingsError: an address we cannot use, or a TLS set-up without its files; never the value."""
        env = os.environ if environ is None else environ
        host = env.get("DOCKER_HOST") or None
        if host is not None:
            _check_scheme("DOCKER_HOST", host)
            cert_path = env.get("DOCKER_CERT_PATH") or None
            verify = bool(env.get("DOCKER_TLS_VERIFY"))  # any non-empty value, as the docker CLI reads it
            if not (verify or cert_path):
                return cls(host, "DOCKER_HOST")
            directory = cert_path or os.path.join(os.path.expanduser("~"), ".docker")
            missing = [name for name in _TLS_FILES if not os.path.isfile(os.path.join(directory, name))]
            if missing:
                raise SettingsError(
                    "DOCKER_CERT_PATH", f"must be a directory holding ca.pem, cert.pem and key.pem (missing: "
                    f"{', '.join(missing)})"
                )  # fmt: skip
            ca, cert, key = (os.path.join(directory, name) for name in _TLS_FILES)
            tls = TLSConfig(client_cert=(cert, key), ca_cert=ca, verify=verify)
            return cls(host, "DOCKER_HOST", tls, verify)
        variable = "DOCKER_CONTEXT" if env.get("DOCKER_CONTEXT") else "the current Docker context"
        name = env.get("DOCKER_CONTEXT") or get_current_context_name()
        if name == "default":
            return cls(None, "default")
        try:
            context = ContextAPI.get_context(name)
        except docker.errors.DockerException:
            context = None
        if context is None or not context.Host:
            raise SettingsError(variable, "names a Docker context that does not exist (see `docker context ls`)")
        _check_scheme(variable, context.Host)
        endpoint = cast(dict[str, Any], context.endpoints.get("docker") or {})
        tls, verify = _context_tls(str(context.tls_path or ""), bool(endpoint.get("SkipTLSVerify")))
        return cls(str(context.Host), f"Docker context {_printable(name, 64)}", tls, verify)

    def require_checked(self) -> None:
        """:raises SettingsError: anyone on the way could pose as the engine (plain TCP, or TLS that does not check
        the engine's certificate); whoever answers as the engine would see every sandbox's files and output."""
        if self.checked:
            return
        variable = "DOCKER_HOST" if self.origin == "DOCKER_HOST" else "the current Docker context"
        if self.plain_http and self.tls is not None:
            raise SettingsError(variable, HTTP_IGNORES_TLS + " (use tcp:// or https://)")
        raise SettingsError(
            variable,
            "reaches the engine without TLS that checks its certificate (set DOCKER_TLS_VERIFY=1 and "
            "DOCKER_CERT_PATH, or use ssh://; `code-sandbox doctor` explains)",
        )

    @property
    def checked(self) -> bool:
        """Whether nobody between here and the engine can pose as it: a local socket, ssh (host keys), or TLS that
        checks the engine's certificate."""
        return self.local or self.ssh or (self.tls is not None and self.tls_verify and not self.plain_http)

    @property
    def plain_http(self) -> bool:
        """Whether the address is ``http://``, which the docker SDK always reaches in plain text: it takes the scheme
        as the word on TLS and drops the TLS settings (only ``tcp://`` follows them, and ``https://`` always uses
        TLS)."""
        return (self.url or "").lower().startswith("http://")

    @property
    def ssh(self) -> bool:
        """Whether the engine is reached over ssh (``docker system dial-stdio`` on its host)."""
        return (self.url or "").startswith("ssh://")

    @property
    def local(self) -> bool:
        """Whether the engine is reached through a socket of this machine (its files are this machine's)."""
        return self.url is None or self.url.startswith(("unix://", "npipe://"))

    def described(self) -> str:
        """The address shown, and where it came from unless it is the default: ``tcp://host:2376 (DOCKER_HOST)``."""
        return self.shown() if self.origin == "default" else f"{self.shown()} ({self.origin})"

    def shown(self) -> str:
        """The address without user, password, query or fragment: safe to print and to log."""
        if self.url is None:
            return "the default socket"
        parts = urlsplit(self.url)
        location = parts.hostname or ""
        if parts.port is not None:
            location += f":{parts.port}"
        return f"{parts.scheme}://{location}{parts.path}"


HTTP_IGNORES_TLS = "is an http:// address, which is reached in plain text whatever the TLS settings say"


def _check_scheme(variable: str, address: str) -> None:
    scheme = address.partition("://")[0].lower() if "://" in address else ""
    if scheme not in ("unix", "tcp", "ssh", "npipe", "http", "https"):
        raise SettingsError(variable, "must be a unix://, tcp://, ssh:// or npipe:// address")
    if scheme in ("tcp", "ssh", "http", "https"):
        try:
            urlsplit(address).port  # noqa: B018 - it raises for a port out of range or a broken host
        except ValueError:
            raise SettingsError(variable, "must be a unix://, tcp://, ssh:// or npipe:// address") from None


def _context_tls(directory: str, skip_verify: bool) -> tuple[TLSConfig | None, bool]:
    """A context's TLS from whatever files it keeps (``docker context create --docker ca=...,cert=...,key=...``):
    a CA alone still means the engine's certificate is checked, as the docker CLI does. No files: no TLS."""
    endpoint = os.path.join(directory, "docker")
    names = sorted(os.listdir(endpoint)) if directory and os.path.isdir(endpoint) else []
    # The docker CLI keeps ca.pem, cert.pem and key.pem; the SDK keeps the files' own names: found by prefix.
    present = {kind: os.path.join(endpoint, name) for kind in ("ca", "cert", "key") for name in names
               if name.startswith(kind)}  # fmt: skip
    if not present:
        return None, False
    client = (present["cert"], present["key"]) if {"cert", "key"} <= present.keys() else None
    verify = not skip_verify and "ca" in present
    return TLSConfig(client_cert=client, ca_cert=present.get("ca"), verify=verify), verify


@dataclass(frozen=True)
class DaemonFacts:
    """What core needs to know about the Docker daemon."""

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
    config: ImageConfig = field(default_factory=lambda: ImageConfig())


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

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> ImageConfig:
        def strings(key: str) -> tuple[str, ...]:
            value = cast(Iterable[Any], config.get(key) or ())  # a list, or a map whose keys are the values
            return (
                tuple(sorted(map(str, cast(Mapping[str, Any], value))))
                if isinstance(value, dict)
                else tuple(map(str, value))
            )

        healthcheck = cast(Mapping[str, Any], config.get("Healthcheck") or {})
        return cls(
            env=strings("Env"),
            entrypoint=strings("Entrypoint"),
            cmd=strings("Cmd"),
            working_dir=str(config.get("WorkingDir") or ""),
            healthcheck=tuple(map(str, cast(list[Any], healthcheck.get("Test") or []))),
            volumes=strings("Volumes"),
            exposed_ports=strings("ExposedPorts"),
            on_build=strings("OnBuild"),
            stop_signal=str(config.get("StopSignal") or ""),
            shell=strings("Shell"),
        )


@dataclass(frozen=True)
class ContainerFacts:
    """A container as listed by the daemon. ``id`` never leaves core."""

    id: str
    labels: Mapping[str, str]
    state: str
    created: float | None


@dataclass(frozen=True)
class VolumeFacts:
    """A sandbox's tmpfs volume on Podman. ``name`` never leaves core."""

    name: str
    labels: Mapping[str, str]
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
class ExecResult:
    """What an exec returned. ``stdout`` and ``stderr`` are bounded by the caller's limits."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes


def build_create_arguments(
    request: ContainerRequest, *, start: bool, runtime: RuntimeFacts, architecture: str
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
        "security_opt": hardening.security_opt(apparmor=request.apparmor, seccomp=profile_text(architecture)),
        "mem_limit": hardening.memory_bytes,
        "memswap_limit": hardening.memory_bytes,
        "nano_cpus": hardening.nano_cpus,
        "pids_limit": hardening.pids_limit,
        "init": True,
        "ulimits": [
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="nofile", soft=hardening.nofile, hard=hardening.nofile),
        ],
        "tmpfs": {**hardening.tmpfs(request.uid), **dict.fromkeys(SEALED_DIRS, SEALED_TMPFS)},
        "log_config": LogConfig(type="none"),
        "auto_remove": start,
        "privileged": False,
        "cgroupns": "private",
        "ipc_mode": "none",  # no /dev/shm: it would be writable memory outside the workspace quota
    }
    # Nothing the image says changes how the container starts: the entrypoint is ours (the image's and its command
    # are then both ignored), every variable the image sets is set here (empty unless ours), and its health check
    # is switched off. Anonymous volumes that an image's VOLUME makes go with the container (``v=True``).
    environment = {
        **dict.fromkeys(request.image_environment, ""),
        **ENVIRONMENT,
        **(UNSEALED_ENVIRONMENT if runtime.user_space_kernel else {}),
    }
    create = {
        "image": request.image_id,
        "entrypoint": request.command[:1],
        "command": request.command[1:],
        "user": SUPERVISOR_USER,
        "environment": environment,
        "healthcheck": {"Test": ["NONE"]},
        "labels": {**request.labels, LABEL_RUNTIME: runtime.name},
        "hostname": HOSTNAME,
        "network_disabled": True,
        "working_dir": WORKSPACE_DIR,
    }
    return create, host_config


# -- Podman ---------------------------------------------------------------------------------------------------------

PODMAN_NPROC = 32768
"""RLIMIT_NPROC of Podman's containers: at or below the hard limit that Podman sets for itself, so a service without
CAP_SYS_RESOURCE can grant it. It counts a host uid's processes in every container, and the supervisor's uid is every
sandbox's, so it is high; the PID limit bounds each sandbox."""
_PODMAN_OWN_TMPFS = ("/run", "/var/tmp")  # noqa: S108 - inside the container
_SEALED_TMPFS = SEALED_TMPFS + ",notmpcopyup"
_VOLUME_NAME = re.compile(r"code-sandbox-[0-9a-f]{32}")
_PAGE_BYTES = 4096
_BIND_FLAGS = ("rw", "noexec", "nosuid", "nodev")
_NO_COPY = "nocopy"  # a new volume would otherwise get the image directory's content
_VOLUME_OPTIONS = ("nr_inodes", "mode", "uid", "gid")


@dataclass(frozen=True)
class TmpfsVolume:
    """One tmpfs mount of a sandbox as Podman takes it: a tmpfs volume of the local driver, named at random."""

    name: str
    path: str
    options: str
    """The driver's ``o``: the mount options of the tmpfs."""
    flags: str
    """The bind's flags."""

    @classmethod
    def of(cls, path: str, tmpfs_options: str) -> TmpfsVolume:
        """:raises ValueError: an option with no Podman form (a new hardening option must be mapped here)."""
        options: list[str] = []
        flags: list[str] = []
        for option in tmpfs_options.split(","):
            key, _, value = option.partition("=")
            if option in _BIND_FLAGS:
                flags.append(option)
            elif key == "size":
                options.append(f"nr_blocks={-(-int(value) // _PAGE_BYTES)}")
            elif key in _VOLUME_OPTIONS:
                options.append(option)
            else:
                raise ValueError(f"the tmpfs option {key!r} has no Podman form")
        options += [flag for flag in flags if flag != "rw"]
        return cls(f"code-sandbox-{secrets.token_hex(16)}", path, ",".join(options), ",".join([*flags, _NO_COPY]))

    def driver_options(self) -> dict[str, str]:
        return {"type": "tmpfs", "device": "tmpfs", "o": self.options}

    def bind(self) -> str:
        return f"{self.name}:{self.path}:{self.flags}"


def tmpfs_volumes(request: ContainerRequest) -> list[TmpfsVolume]:
    return [TmpfsVolume.of(path, options) for path, options in request.hardening.tmpfs(request.uid).items()]


def podman_host_config(
    host_config: Mapping[str, Any], request: ContainerRequest, volumes: Iterable[TmpfsVolume], seccomp_file: str
) -> dict[str, Any]:
    """:func:`build_create_arguments`' host configuration as Podman needs it (the differences above)."""
    host = {key: value for key, value in host_config.items() if key != "runtime"}
    host["security_opt"] = request.hardening.security_opt(apparmor=False, seccomp=seccomp_file)
    host["ulimits"] = [*host_config["ulimits"], Ulimit(name="nproc", soft=PODMAN_NPROC, hard=PODMAN_NPROC)]
    host["tmpfs"] = dict.fromkeys((*_PODMAN_OWN_TMPFS, *SEALED_DIRS), _SEALED_TMPFS)
    host["binds"] = [volume.bind() for volume in volumes]
    return host


def _podman_init_missing(exc: docker.errors.APIError) -> bool:
    return "container-init binary not found" in str(exc.explanation or "")


def _no_catatonit() -> SandboxError:
    return SandboxError(
        ErrorCode.CONTAINER_START_FAILED,
        "Podman cannot start sandboxes: it needs catatonit for their init process",
        hint="install the catatonit package on the Podman host",
    )


def podman_ignores_runtime(own: str) -> SettingsError:
    """The error for a runtime asked of Podman: its Docker-compatible API would ignore it and run the container under
    the service's own runtime without a word."""
    shown = own if is_runtime_name(own) else "its own"
    error = SettingsError(
        env_name("runtime"),
        f"is ignored by Podman's Docker-compatible API, which runs every container under the service's own runtime "
        f"({shown})",
    )
    error.hint = 'unset it; for another runtime set runtime = "NAME" under [engine] in the service\'s containers.conf'
    return error


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
        raise SandboxError(code, message, engine_text=_engine_text(exc)) from None


def _engine_text(exc: BaseException) -> str | None:
    """What the engine said when it refused (an API error's explanation), for the operator; ``None`` for a failure on
    this side of the wire, whose text is ours or the OS's, not the engine's."""
    if not isinstance(exc, docker.errors.APIError):
        return None
    explanation = exc.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or f"HTTP {exc.status_code}")


_RUNTIME_REFUSALS = ("OCI runtime error", "OCI permission denied")
"""How Podman's answer to a start says that its OCI runtime refused the container ("crun: ...: OCI runtime
error")."""


def _runtime_refused(exc: docker.errors.APIError) -> bool:
    return exc.status_code == 500 and any(words in str(exc.explanation or "") for words in _RUNTIME_REFUSALS)


PODMAN_RUNTIME_FIX = (
    'set another runtime for the Podman service in containers.conf (under [engine]: runtime = "runc", with runc '
    "installed) and restart the service"
)
PODMAN_HYBRID_CGROUPS_FIX = (
    "crun cannot run containers on hybrid cgroups (cgroup v1 controllers beside a cgroup2 mount): under [engine] in "
    'the Podman service\'s containers.conf set runtime = "runc" (with runc installed) and restart the service, or '
    "boot the host with the unified cgroup v2 hierarchy alone: systemd.unified_cgroup_hierarchy=1 on its kernel "
    "command line"
)


def runtime_cannot_start(runtime: RuntimeFacts, exc: docker.errors.APIError) -> SandboxError:
    """The error for a Podman service whose OCI runtime refuses a sandbox's start: for the operator, the hint names
    the runtime and the fix, and the engine's words say why. (On Docker "OCI runtime" heads nearly every refused
    start, a missing file as much as a runtime that cannot run, so Docker's refusals keep the plain message.)"""
    words = _engine_text(exc) or ""
    name = runtime.name if is_runtime_name(runtime.name) else "its runtime"
    fix = PODMAN_HYBRID_CGROUPS_FIX if "cgroups in hybrid mode" in words else PODMAN_RUNTIME_FIX
    return SandboxError(
        ErrorCode.CONTAINER_START_FAILED,
        "Podman's container runtime cannot start containers on this host",
        hint=f"the runtime is {name}; {fix}",
        engine_text=words,
    )


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
        self._version: dict[str, Any] = {}
        """The engine's answer to ``/version``, asked once when the client is made."""
        self._clock_anchor: tuple[float, float] | None = None
        """The engine's time and this machine's monotonic clock at one moment: :meth:`now` counts on from there."""
        self._volumes: dict[str, tuple[str, ...]] = {}
        """Podman: the tmpfs volumes of each container this engine made, removed with it (even after it removed
        itself)."""
        self._seccomp_files: dict[str, str] = {}
        """Podman: the seccomp profile's file for each architecture, once checked or written (:meth:`_seccomp_file`)."""

    @classmethod
    def for_settings(cls, settings: Settings, **options: Any) -> DockerEngine:
        """The engine as the operator configured it: their tag on every container, their runtime for every one."""
        return cls(labels=settings.container_labels(), runtime=settings.runtime, **options)

    @property
    def address(self) -> EngineAddress:
        """Where the engine is; read from the environment on first use unless given.

        :raises SettingsError: the environment names an address or TLS set-up that cannot be used.
        """
        if self._address is None:
            self._address = EngineAddress.from_environment()
        return self._address

    def api(self) -> Any:
        with self._lock:
            if self._api is None:
                address = self.address
                address.require_checked()
                try:
                    # A version is given so that the client does not ask the engine before trust_env is off.
                    api: Any = docker.APIClient(base_url=address.url, tls=address.tls or False, timeout=self.timeout,
                                           version=docker.constants.MINIMUM_DOCKER_API_VERSION)  # fmt: skip
                    # The engine is trusted through DOCKER_CERT_PATH alone: requests' environment is not read
                    # (REQUESTS_CA_BUNDLE would replace the engine's CA; a proxy or .netrc would see its traffic).
                    api.trust_env = False
                    # Then the API version the engine speaks, as the client's "auto" finds it; the answer also says
                    # what the engine is (daemon_facts).
                    self._version = cast(dict[str, Any], api.version(api_version=False))
                    api._version = str(self._version["ApiVersion"])
                except paramiko.SSHException:
                    raise SandboxError(
                        ErrorCode.CONTAINER_UNAVAILABLE,
                        "the ssh connection to the Docker engine's host failed",
                        hint="the host must be in ~/.ssh/known_hosts and accept this user's key; "
                        "`ssh HOST docker version` must work",
                    ) from None
                except requests.exceptions.SSLError:
                    raise SandboxError(
                        ErrorCode.CONTAINER_UNAVAILABLE,
                        "the TLS connection to the Docker engine failed",
                        hint="DOCKER_CERT_PATH must hold the CA that signed the engine's certificate, and a client "
                        "certificate the engine accepts (run `code-sandbox doctor`)",
                    ) from None
                except (
                    docker.errors.DockerException,
                    requests.exceptions.RequestException,
                    KeyError,
                    *_TRANSPORT_ERRORS,
                ):
                    raise unavailable() from None
                self._api = api
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
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine did not answer"):
            self.api().ping()

    def daemon_facts(self) -> DaemonFacts:
        if self._daemon is None:
            with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine did not describe itself"):
                api = self.api()
                started = time.monotonic()
                info = cast(dict[str, Any], api.info())
                ended = time.monotonic()
            version = self._version
            engine_time = _parse_created(info.get("SystemTime"))
            if engine_time is not None:
                # The engine read its clock somewhere within the call; its middle is off by at most half the call.
                self._clock_anchor = (engine_time, (started + ended) / 2)
            components = [cast(dict[str, Any], c) for c in cast(list[object], version.get("Components") or [])
                          if isinstance(c, dict)]  # fmt: skip
            podman = next((c for c in components if str(c.get("Name", "")).startswith("Podman")), None)
            options = [str(option) for option in cast(list[object], info.get("SecurityOptions") or [])]
            runtimes = cast(dict[str, Any], info.get("Runtimes") or {})
            registered = {
                str(name): str(cast(dict[str, Any], value).get("path") or "") if isinstance(value, dict) else ""
                for name, value in runtimes.items()
            }
            default_runtime = str(info.get("DefaultRuntime") or "runc")
            if podman is not None:
                default_runtime, path = self._podman_runtime(podman)
                registered = {default_runtime: path}
            self._daemon = DaemonFacts(
                runtimes=registered,
                default_runtime=default_runtime,
                product=PODMAN if podman is not None else "Docker Engine",
                version=_printable(str(version.get("Version") or info.get("ServerVersion") or "")),
                operating_system=_printable(str(info.get("OperatingSystem") or "")),
                architecture=normalise_arch(str(info.get("Architecture", ""))),
                os_type=str(info.get("OSType", "")),
                apparmor=any(option.startswith("name=apparmor") for option in options),
                seccomp=any(
                    option.startswith("name=seccomp") and "profile=unconfined" not in option for option in options
                ),
            )
        return self._daemon

    def runtime_in_force(self) -> RuntimeFacts:
        """The runtime every container of this engine runs under: the one asked for, or the engine's default (on
        Podman, the service's own runtime, the only one it runs containers under).

        :raises SettingsError: the engine has no runtime of the name asked for (the message names those it has).
        """
        daemon = self.daemon_facts()
        name = self.runtime or daemon.default_runtime
        if daemon.product == PODMAN and name != daemon.default_runtime:
            raise podman_ignores_runtime(daemon.default_runtime)
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
            failure: str | None = None
            for event in cast(Iterable[dict[str, Any]], events):
                if failure is not None:
                    continue  # read to the end, which comes right after an error: the connection is then released
                if "error" in event or "errorDetail" in event:
                    detail = event.get("errorDetail")
                    said = cast(dict[str, Any], detail).get("message") if isinstance(detail, dict) else None
                    failure = str(event.get("error") or said or "")
                    continue
                stream = str(event.get("stream", "")).strip()
                if stream.startswith("Step "):
                    on_step(stream.split(" :", 1)[0])
                aux = event.get("aux")
                if isinstance(aux, dict) and "ID" in aux:
                    image_id = str(cast(dict[str, Any], aux)["ID"])
            if failure is not None:
                raise SandboxError(
                    ErrorCode.IMAGE_BUILD_FAILED, "the Docker engine could not build the image", engine_text=failure
                )
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
            architecture=normalise_arch(str(data.get("Architecture", ""))),
            size=int(data.get("Size") or 0),
            config=ImageConfig.of(config),
        )

    def image_annotations(self, image_id: str) -> tuple[str, ...]:
        """The image's OCI annotations as ``key=value``: Podman copies them into its containers' runtime spec, where
        crun and runc act on some. Asked of Podman only (Docker keeps none an image can set), and only by
        verification: :meth:`image_facts` runs at every create and does not ask."""
        if not self._podman():
            return ()
        api = self.api()
        with _translate(ErrorCode.IMAGE_INVALID, "the Docker engine could not inspect the image"):
            # Private SDK calls: the Docker API has no annotations, and the SDK no call for Podman's own endpoint.
            response = api._get(api._url("/libpod/images/{0}/json", image_id))
            image = cast(dict[str, Any], api._result(response, json=True))
        annotations = cast(dict[str, Any], image.get("Annotations") or {})
        return tuple(sorted(f"{key}={value}" for key, value in annotations.items()))

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
        architecture = self.daemon_facts().architecture
        try:
            create_kwargs, host_kwargs = build_create_arguments(
                request, start=start, runtime=runtime, architecture=architecture
            )
        except ValueError:  # no seccomp profile for it (image builds refuse such engines first)
            raise SandboxError(
                ErrorCode.CONTAINER_START_FAILED, "sandboxes run on x86_64 and aarch64 engines only"
            ) from None
        podman = self._podman()
        volumes = tmpfs_volumes(request) if podman else []
        try:
            if podman:
                self._create_volumes(volumes, create_kwargs["labels"])
                host_kwargs = podman_host_config(host_kwargs, request, volumes, self._seccomp_file(architecture))
            with _translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
                host_config = api.create_host_config(**host_kwargs)
                try:
                    created = cast(dict[str, Any], api.create_container(**create_kwargs, host_config=host_config))
                except docker.errors.APIError as exc:
                    if podman and _podman_init_missing(exc):
                        raise _no_catatonit() from None
                    raise
                container_id = str(created["Id"])
            if volumes:
                self._volumes[container_id] = tuple(volume.name for volume in volumes)
                self._check_volumes(volumes)
            if before_start is not None:
                before_start(container_id)
            if start:
                self._start(container_id, runtime)
            return container_id
        except BaseException:
            with contextlib.suppress(SandboxError):
                if container_id is not None:
                    self.remove_container(container_id)
                else:
                    self._remove_volumes(volume.name for volume in volumes)
            raise

    def signal_container(self, container_id: str, signal: str) -> None:
        """Send a signal to the container's main process (docker-init forwards it to the watchdog)."""
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is not available"):
            try:
                self.api().kill(container_id, signal=signal)
            except docker.errors.APIError as exc:
                if self._not_running(exc):
                    raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone") from None
                raise

    def start_container(self, container_id: str) -> None:
        """Start a container created with ``start=False`` (it then does not remove itself)."""
        self._start(container_id, self.runtime_in_force())

    def _start(self, container_id: str, runtime: RuntimeFacts) -> None:
        with _translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
            try:
                self.api().start(container_id)
            except docker.errors.APIError as exc:
                if self._podman() and _runtime_refused(exc):
                    raise runtime_cannot_start(runtime, exc) from None
                raise

    def remove_container(self, container_id: str) -> bool:
        """Force-remove a container (on Podman, and its tmpfs volumes). Returns ``False`` when Docker says it is
        already gone."""
        if not self._podman():
            return self._remove_container(container_id)
        volumes = self._volumes.get(container_id)
        if volumes is None:
            volumes = self._volumes_of(container_id)
        removed = self._remove_container(container_id)
        self._remove_volumes(volumes)
        self._volumes.pop(container_id, None)
        return removed

    def _remove_container(self, container_id: str) -> bool:
        with _translate(ErrorCode.CONTAINER_REMOVAL_FAILED, "the sandbox container could not be removed"):
            try:
                self.api().remove_container(container_id, force=True, v=True)
            except docker.errors.APIError as exc:
                if self._gone(exc):
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
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not inspect a sandbox"):
            try:
                data = cast(dict[str, Any], self.api().inspect_container(container_id))
            except docker.errors.APIError as exc:
                if self._gone(exc):
                    return None
                raise
        config = cast(dict[str, Any], data.get("Config") or {})
        state = cast(dict[str, Any], data.get("State") or {})
        return ContainerFacts(
            id=str(data["Id"]),
            labels={str(k): str(v) for k, v in cast(dict[str, Any], config.get("Labels") or {}).items()},
            state=str(state.get("Status", "")),
            created=_parse_created(data.get("Created")),
        )

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
                        "/" + member.name.removeprefix("./").lstrip("/"),
                        kind,
                        member.mode & 0o7777,
                        member.uid,
                        digest,
                        member.gid,
                        member.linkname,
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
        repeatable: bool = False,
    ) -> ExecResult:
        """Run ``argv`` in the container (no shell, no TTY) and collect its output within ``timeout`` seconds.

        ``stdin`` chunks are streamed over the exec's attach socket, then its write half is closed. Output beyond
        ``max_stdout``/``max_stderr`` is a protocol violation (our helpers never produce it) and fails the call.
        ``on_stderr`` receives stderr chunks as they arrive (the runner's progress lines). ``exit_code=False``
        skips the ``exec_inspect`` round trip for callers that judge the output alone (the helpers' one-line answer).
        ``repeatable`` says that running the command twice does no harm (a query, a kill-all): on Podman, whose exec
        API can lose a short command's whole output when busy (exit 0, nothing on either stream), such a command
        without stdin runs again, up to :data:`PODMAN_LOST_OUTPUT_RETRIES` times.

        :raises SandboxError: ``TIMEOUT`` when the deadline passes, ``TRANSFER_FAILED`` when the stream breaks,
            ``CONTAINER_UNAVAILABLE`` when the container or daemon is gone.
        """
        deadline = time.monotonic() + timeout
        retries = PODMAN_LOST_OUTPUT_RETRIES if repeatable and stdin is None and self._podman() else 0
        while True:
            result, exec_id = self._exec_once(
                container_id, argv, user=user, stdin=stdin, deadline=deadline, max_stdout=max_stdout,
                max_stderr=max_stderr, on_stderr=on_stderr, exit_code=exit_code,
            )  # fmt: skip
            if not retries or result.stdout or result.stderr:
                return result
            code = result.exit_code if exit_code else self._exec_exit_code(exec_id, deadline)
            if code != 0:
                return result
            retries -= 1
            logger.debug("the engine lost an exec's output; running it again")

    def _exec_once(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        stdin: Iterable[bytes] | None,
        deadline: float,
        max_stdout: int,
        max_stderr: int,
        on_stderr: Callable[[bytes], None] | None,
        exit_code: bool,
    ) -> tuple[ExecResult, str]:
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
            _close_stream(attached, raw)
        code = self._exec_exit_code(exec_id, deadline) if exit_code else None
        return ExecResult(exit_code=code, stdout=stdout, stderr=stderr), exec_id

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
            except docker.errors.APIError as exc:
                if self._not_running(exc):
                    raise SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone") from None
                raise
            attached = api.exec_start(exec_id, socket=True)
        return exec_id, attached, cast(socket.socket, getattr(attached, "_sock", attached))

    # -- Podman -------------------------------------------------------------------------------------------------

    def _podman(self) -> bool:
        return self.daemon_facts().product == PODMAN

    def _not_running(self, exc: docker.errors.APIError) -> bool:
        """Whether the container is gone (404; Podman mid-removal: :meth:`_gone`) or not running (Docker: 409;
        Podman: 500 "container state improper")."""
        if exc.status_code == 409 or self._gone(exc):
            return True
        return exc.status_code == 500 and self._podman() and "container state improper" in str(exc.explanation or "")

    def _gone(self, exc: docker.errors.APIError) -> bool:
        """Whether the engine says the container no longer exists: 404, or Podman's 500 "container ... does not exist
        in database: no such container" for one it is removing (seen in 4 of 24 inspects of self-removing containers
        polled on Podman 4.3.1)."""
        if exc.status_code == 404:
            return True
        return exc.status_code == 500 and self._podman() and "no such container" in str(exc.explanation or "")

    def _podman_runtime(self, podman: Mapping[str, Any]) -> tuple[str, str]:
        """The service's own OCI runtime (name, binary): the one every container of it runs under."""
        details = cast(dict[str, Any], podman.get("Details") or {})
        version = str(details.get("APIVersion") or podman.get("Version") or "")
        if not re.fullmatch(r"[0-9][0-9A-Za-z.-]{0,31}", version):
            raise unavailable()
        api = self.api()
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine did not describe itself"):
            info = cast(dict[str, Any], api._result(api._get(f"{api.base_url}/v{version}/libpod/info"), json=True))
        runtime = cast(dict[str, Any], cast(dict[str, Any], info.get("host") or {}).get("ociRuntime") or {})
        name = str(runtime.get("name") or "")
        if not name:
            raise unavailable()
        return name, str(runtime.get("path") or "")

    def _seccomp_file(self, architecture: str) -> str:
        """Our seccomp profile as a file Podman can read: Podman takes ``seccomp=`` as a path on its own host, never
        the profile's text. Written once, content-addressed, in this user's private state directory; an engine on
        another host cannot read it, so none of its sandboxes start (it would run them under its own profile, which
        lets a sandbox hold TCP and UDP buffers no cgroup counts)."""
        if not self.address.local:
            raise SandboxError(
                ErrorCode.CONTAINER_START_FAILED,
                "a Podman engine on another host cannot be given the sandbox's seccomp profile",
                hint="run code-sandbox on the Podman host (its socket), or use a Docker engine",
            )
        known = self._seccomp_files.get(architecture)
        if known is not None:  # checked or written once per engine object, not at every create
            return known
        text = profile_text(architecture)
        path = default_state_dir() / "seccomp" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"
        try:
            current = path.read_text()
        except OSError:
            current = None
        if current != text:
            temporary = path.with_name(f".{secrets.token_hex(8)}.tmp")
            try:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                temporary.write_text(text)
                os.replace(temporary, path)
            except OSError:
                temporary.unlink(missing_ok=True)
                raise SandboxError(
                    ErrorCode.CONTAINER_START_FAILED,
                    "the sandbox's seccomp profile could not be written for Podman",
                    hint="check that the state directory (~/.local/state/code-sandbox) is writable",
                ) from None
        self._seccomp_files[architecture] = str(path)
        return str(path)

    def _create_volumes(self, volumes: Iterable[TmpfsVolume], labels: Mapping[str, str]) -> None:
        api = self.api()
        with _translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
            for volume in volumes:
                api.create_volume(volume.name, driver="local", driver_opts=volume.driver_options(), labels=dict(labels))

    def _check_volumes(self, volumes: Iterable[TmpfsVolume]) -> None:
        """Each volume the new container mounts must be the bounded tmpfs made for it: had a sweep removed one before
        the container's create, Podman would have made a plain directory of the same name, with no bound at all.

        :raises SandboxError: ``CONTAINER_START_FAILED`` (the caller removes the container and the volumes).
        """
        api = self.api()
        with _translate(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started"):
            for volume in volumes:
                options = cast(dict[str, Any], api.inspect_volume(volume.name).get("Options") or {})
                if any(str(options.get(key)) != value for key, value in volume.driver_options().items()):
                    raise SandboxError(ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started")

    def _volumes_of(self, container_id: str) -> tuple[str, ...]:
        """The tmpfs volumes a container of another engine object (or process) mounts."""
        with _translate(ErrorCode.CONTAINER_REMOVAL_FAILED, "the sandbox container could not be removed"):
            try:
                data = cast(dict[str, Any], self.api().inspect_container(container_id))
            except docker.errors.NotFound:
                return ()
        mounts = [cast(dict[str, Any], m) for m in cast(list[object], data.get("Mounts") or []) if isinstance(m, dict)]
        names = (str(mount.get("Name") or "") for mount in mounts if mount.get("Type") == "volume")
        return tuple(name for name in names if _VOLUME_NAME.fullmatch(name))

    def _remove_volumes(self, names: Iterable[str], *, wait: float = 5) -> None:
        """Remove volumes (never with ``force``, which on Podman removes the containers using them too); one still
        held by a container being removed is waited for, ``wait`` seconds at most."""
        api = self.api()
        deadline = time.monotonic() + wait
        for name in names:
            with _translate(ErrorCode.CONTAINER_REMOVAL_FAILED, "the sandbox container could not be removed"):
                while True:
                    try:
                        api.remove_volume(name)
                    except docker.errors.NotFound:
                        pass
                    except docker.errors.APIError as exc:
                        if exc.status_code != 409 or time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
                        continue
                    break

    def sandbox_volumes(self, *, tag: str | None = None, unused: bool = False) -> list[VolumeFacts]:
        """Podman: the tmpfs volumes of managed sandboxes (of ``tag``'s servers, when given; ``unused``: only those
        that no container uses). None elsewhere: no other engine gets volumes."""
        if not self._podman():
            return []
        filters: dict[str, Any] = {"label": f"{LABEL_MANAGED}=true"}  # one label: Podman ORs several
        if unused:
            filters["dangling"] = True
        with _translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not list sandbox volumes"):
            answer = cast(dict[str, Any], self.api().volumes(filters=filters))
        rows = [cast(dict[str, Any], r) for r in cast(list[object], answer.get("Volumes") or []) if isinstance(r, dict)]
        volumes = [
            VolumeFacts(
                name=str(row.get("Name") or ""),
                labels={str(k): str(v) for k, v in cast(dict[str, Any], row.get("Labels") or {}).items()},
                created=_parse_created(row.get("CreatedAt")),
            )
            for row in rows
        ]
        return [
            volume
            for volume in volumes
            if _VOLUME_NAME.fullmatch(volume.name)
            and volume.labels.get(LABEL_MANAGED) == "true"
            and (tag is None or volume.labels.get(LABEL_TAG) == tag)
        ]

    def remove_leftover_volumes(self, *, tag: str | None = None, grace: float) -> int:
        """Podman: remove the sandbox volumes (of ``tag``'s servers, when given) that no container uses and that are
        older than ``grace`` seconds: left by a container that removed itself, or by a crash. A younger one may be
        another server's, made a moment before its container. Returns how many could not be removed."""
        volumes = self.sandbox_volumes(tag=tag, unused=True)
        now = self.now()  # after the listing: a volume made since is not in it
        failures = 0
        for volume in volumes:
            if volume.created is None or now - volume.created < grace:
                continue
            try:
                self._remove_volumes([volume.name], wait=0)
            except SandboxError:
                failures += 1
        return failures

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
        _close_stream(self._attached, self._raw)


def _close_stream(attached: Any, raw: socket.socket) -> None:
    """Close an exec's attach stream for good. SocketIO.close() leaves the socket it wraps open, so both close; over
    TLS the SDK hangs the HTTP response on the socket, and its file object holds the socket open until it closes."""
    for closable in (attached, raw, getattr(raw, "_response", None)):
        if closable is not None:
            with contextlib.suppress(Exception):  # a response's close may raise what its transport raises
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


def normalise_arch(name: str) -> str:
    """An architecture as Docker's Go names (``amd64``) or the kernel's (``x86_64``) give it, in the kernel's."""
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(name, name)


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def _parse_created(value: object) -> float | None:
    """Seconds since the epoch from the engine's RFC 3339 time with up to nanoseconds, e.g.
    ``2026-12-02T15:48:04.123456789Z`` (Docker) or ``2026-12-02T16:48:04.1+01:00`` (Podman); ``None`` otherwise."""
    match = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    main, fraction, zone = match.groups()
    try:
        parsed = datetime.fromisoformat(main + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    return parsed.timestamp() + (float("0." + fraction) if fraction else 0.0)


def _printable(text: str, limit: int = 80) -> str:
    """Engine text for ``doctor``'s table: printable ASCII only, and short."""
    return "".join(ch for ch in text if " " <= ch <= "~")[:limit]
