"""Podman's Docker-compatible API: what differs from Docker's, and how this adapter makes up for each difference.

The engine may be Podman's Docker-compatible API (as tested: rootful Podman 4.3; asked of the engine,
:attr:`DaemonFacts.product`). It takes the same arguments with these differences, each handled in this module
and :mod:`code_sandbox.docker_engine.volumes`, and nowhere else:

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
  (crun on hybrid cgroups), every start fails with "OCI runtime error": :func:`start_refusal` names the fix.
- It ignores ``cgroupns: private``: a sandbox sees the host's cgroup paths in ``/proc/self/cgroup``.
- Its AppArmor profile is ``containers-default-*``, not ``docker-default``: none is named, so Podman applies its own.
- ``init`` needs catatonit; without it every create fails (:func:`create_refusal`).
- A kill or exec on a stopped container fails with 500 "container state improper", not 409; an inspect, kill or
  removal of a container it is removing fails with 500 "... no such container", not 404 (:func:`gone`).
- It adds ``TERM`` and ``container=podman`` to the environment, and an exec that has not started inspects as exited
  with code 0 (Docker: null); neither matters here.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Mapping

from docker.types import Ulimit

from code_sandbox.docker_engine.answers import Component, PodmanImage, PodmanInfo
from code_sandbox.docker_engine.arguments import ulimits
from code_sandbox.docker_engine.failures import APIError, engine_text, said, unavailable
from code_sandbox.docker_engine.sdk import Client, get_json
from code_sandbox.docker_engine.volumes import TmpfsVolume
from code_sandbox.engine import RuntimeFacts
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import SEALED_TMPFS, ContainerRequest, sealed_dirs
from code_sandbox.liveness import default_state_dir
from code_sandbox.seccomp import profile_text
from code_sandbox.settings import SettingsError, env_name, is_runtime_name

PODMAN_NPROC = 32768
"""RLIMIT_NPROC of Podman's containers: at or below the hard limit that Podman sets for itself, so a service without
CAP_SYS_RESOURCE can grant it. It counts a host uid's processes in every container, and the supervisor's uid is every
sandbox's, so it is high; the PID limit bounds each sandbox."""
PODMAN_LOST_OUTPUT_RETRIES = 2
"""How often a repeatable exec whose output Podman lost runs again (measured on Podman 4.3.1 under load: 6 of 60 short
runtime-version execs came back with exit 0 and no output)."""
_OWN_TMPFS = ("/var/tmp",)  # noqa: S108 - inside the container; /run is a volume (volumes.RUN_DIR)
_SEALED_TMPFS = SEALED_TMPFS + ",notmpcopyup"


def host_config(
    docker_host_config: Mapping[str, object],
    request: ContainerRequest,
    volumes: list[TmpfsVolume],
    seccomp_file: str,
    runtime: RuntimeFacts,
) -> dict[str, object]:
    """A hardened container's host configuration as Podman needs it (the differences above)."""
    host = {key: value for key, value in docker_host_config.items() if key != "runtime"}
    hardening = request.hardening
    host["security_opt"] = hardening.security_opt(apparmor=False, seccomp=seccomp_file)
    host["ulimits"] = [*ulimits(hardening), Ulimit(name="nproc", soft=PODMAN_NPROC, hard=PODMAN_NPROC)]
    sealed = sealed_dirs(user_space_kernel=runtime.user_space_kernel)
    host["tmpfs"] = dict.fromkeys((*_OWN_TMPFS, *sealed), _SEALED_TMPFS)
    host["binds"] = [volume.bind() for volume in volumes]
    return host


def gone(exc: APIError, podman: bool) -> bool:
    """Whether the engine says the container no longer exists: 404, or Podman's 500 "container ... does not exist
    in database: no such container" for one it is removing (seen in 4 of 24 inspects of self-removing containers
    polled on Podman 4.3.1)."""
    if exc.status_code == 404:
        return True
    return exc.status_code == 500 and podman and "no such container" in said(exc)


def not_running(exc: APIError, podman: bool) -> bool:
    """Whether the container is gone (:func:`gone`) or not running (Docker: 409; Podman: 500 "container state
    improper")."""
    if exc.status_code == 409 or gone(exc, podman):
        return True
    return exc.status_code == 500 and podman and "container state improper" in said(exc)


def create_refusal(exc: APIError) -> SandboxError | None:
    """What Podman's refusal of a create means, when it is its own: without catatonit it cannot give a container
    the init process asked for."""
    if "container-init binary not found" not in said(exc):
        return None
    return SandboxError(
        ErrorCode.CONTAINER_START_FAILED,
        "Podman cannot start sandboxes: it needs catatonit for their init process",
        hint="install the catatonit package on the Podman host",
    )


def ignores_runtime(own: str) -> SettingsError:
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


_RUNTIME_REFUSALS = ("OCI runtime error", "OCI permission denied")
"""How Podman's answer to a start says that its OCI runtime refused the container ("crun: ...: OCI runtime
error")."""
RUNTIME_FIX = (
    'set another runtime for the Podman service in containers.conf (under [engine]: runtime = "runc", with runc '
    "installed) and restart the service"
)
HYBRID_CGROUPS_FIX = (
    "crun cannot run containers on hybrid cgroups (cgroup v1 controllers beside a cgroup2 mount): under [engine] in "
    'the Podman service\'s containers.conf set runtime = "runc" (with runc installed) and restart the service, or '
    "boot the host with the unified cgroup v2 hierarchy alone: systemd.unified_cgroup_hierarchy=1 on its kernel "
    "command line"
)


def start_refusal(runtime: RuntimeFacts, exc: APIError) -> SandboxError | None:
    """What Podman's refusal of a start means when its OCI runtime refused the sandbox: for the operator, the hint
    names the runtime and the fix, and the engine's words say why. (On Docker "OCI runtime" heads nearly every
    refused start, a missing file as much as a runtime that cannot run, so Docker's refusals keep the plain
    message.)"""
    if exc.status_code != 500 or not any(words in said(exc) for words in _RUNTIME_REFUSALS):
        return None
    words = engine_text(exc) or ""
    name = runtime.name if is_runtime_name(runtime.name) else "its runtime"
    fix = HYBRID_CGROUPS_FIX if "cgroups in hybrid mode" in words else RUNTIME_FIX
    return SandboxError(
        ErrorCode.CONTAINER_START_FAILED,
        "Podman's container runtime cannot start containers on this host",
        hint=f"the runtime is {name}; {fix}",
        engine_text=words,
    )


def service_runtime(api: Client, podman: Component) -> tuple[str, str]:
    """The service's own OCI runtime (name, binary): the one every container of it runs under."""
    details = podman.Details
    version = (details.APIVersion if details else None) or podman.Version or ""
    if not re.fullmatch(r"[0-9][0-9A-Za-z.-]{0,31}", version):
        raise unavailable()
    info = PodmanInfo.model_validate(get_json(api, f"/v{version}/libpod/info"))
    runtime = info.host.ociRuntime if info.host else None
    name = (runtime.name if runtime else None) or ""
    if not name:
        raise unavailable()
    return name, (runtime.path if runtime else None) or ""


def image_annotations(api: Client, image_id: str) -> tuple[str, ...]:
    """The image's OCI annotations as ``key=value``: Podman copies them into its containers' runtime spec, where crun
    and runc act on some (the Docker API has none)."""
    image = PodmanImage.model_validate(get_json(api, "/libpod/images/{0}/json", image_id))
    return tuple(sorted(f"{key}={value}" for key, value in (image.Annotations or {}).items()))


def seccomp_file(architecture: str, *, local: bool) -> str:
    """Our seccomp profile as a file Podman can read: Podman takes ``seccomp=`` as a path on its own host, never the
    profile's text. Content-addressed, in this user's private state directory; an engine on another host cannot
    read it, so none of its sandboxes start (it would run them under its own profile, which lets a sandbox hold TCP
    and UDP buffers no cgroup counts)."""
    if not local:
        raise SandboxError(
            ErrorCode.CONTAINER_START_FAILED,
            "a Podman engine on another host cannot be given the sandbox's seccomp profile",
            hint="run code-sandbox on the Podman host (its socket), or use a Docker engine",
        )
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
    return str(path)
