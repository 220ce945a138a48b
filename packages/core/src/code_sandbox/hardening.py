"""The one place that decides how a sandbox container is configured. Every value here is a security boundary.

These are plain data; the Docker adapter (:mod:`code_sandbox.engine`) turns them into API calls. A test creates a
real container and compares ``docker inspect`` with literal expected values, so a change here cannot slip by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MiB = 1024 * 1024

SANDBOX_UID = 65532
"""Runs user code and every exec that touches user content; owns ``/workspace`` and ``/tmp``."""
SUPERVISOR_UID = 65533
"""Runs the container's main process (the watchdog), so user code cannot signal it."""
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
SUPERVISOR_USER = f"{SUPERVISOR_UID}:{SUPERVISOR_UID}"

WORKSPACE_DIR = "/workspace"
SCRATCH_DIR = "/tmp"  # noqa: S108 - a tmpfs inside the container, never the host's /tmp
HOSTNAME = "sandbox"  # the default hostname would be the container ID, which user code could print

LABEL_PREFIX = "io.code-sandbox."
LABEL_MANAGED = LABEL_PREFIX + "managed"
LABEL_OWNER = LABEL_PREFIX + "owner"
LABEL_PROFILE = LABEL_PREFIX + "profile"
LABEL_EXPIRES_AT = LABEL_PREFIX + "expires-at"
LABEL_SESSION = LABEL_PREFIX + "session"  # the session's hash, or "pool" for a warm container

ENVIRONMENT: Mapping[str, str] = {
    "PATH": "/usr/local/bin",
    "HOME": WORKSPACE_DIR,
    "TMPDIR": SCRATCH_DIR,
    "LANG": "C.UTF-8",
}
"""The fixed environment of the container and of every exec; nothing comes from the host."""


def _tmpfs_options(size_bytes: int) -> str:
    return f"rw,noexec,nosuid,nodev,size={size_bytes},mode=0700,uid={SANDBOX_UID},gid={SANDBOX_UID}"


@dataclass(frozen=True)
class Hardening:
    """Resource limits and isolation settings of one sandbox container."""

    memory_bytes: int = 512 * MiB
    nano_cpus: int = 1_000_000_000
    pids_limit: int = 128
    nofile: int = 1024
    workspace_bytes: int = 64 * MiB
    scratch_bytes: int = 64 * MiB
    tmpfs: Mapping[str, str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "tmpfs",
            {WORKSPACE_DIR: _tmpfs_options(self.workspace_bytes), SCRATCH_DIR: _tmpfs_options(self.scratch_bytes)},
        )

    def security_opt(self, *, apparmor: bool) -> list[str]:
        # Docker's default seccomp profile applies because we never name one; "unconfined" is never set.
        options = ["no-new-privileges:true"]
        if apparmor:
            options.append("apparmor=docker-default")
        return options


@dataclass(frozen=True)
class ContainerRequest:
    """Everything needed to create one sandbox container."""

    image_id: str
    command: list[str]
    labels: Mapping[str, str]
    apparmor: bool
    hardening: Hardening = field(default_factory=Hardening)
