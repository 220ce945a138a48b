"""The one place that decides how a sandbox container is configured. Every value here is a security boundary.

These are plain data; the Docker adapter (:mod:`code_sandbox.docker_engine`) turns them into API calls. A test creates a
real container and compares ``docker inspect`` with literal expected values, so a change here cannot slip by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from code_sandbox import limits

MiB = 1024 * 1024

SANDBOX_UIDS = range(0x7000_0000, 0x7000_0000 + 2**20)
"""Each sandbox runs user code and its helpers under its own uid (and gid) from this range, which owns its
``/workspace`` and ``/tmp``. There is no user namespace, so these are host uids: per-uid kernel limits (inotify
instances, pipe buffers) belong to one sandbox alone. The range (1879048192 to 1880096767) lies above the uids that
systemd assigns to users, dynamic users and nspawn containers (up to 0x6FFFFFFF) and below 2^31, where tools that
read uid_t as signed fail. Other software must not run processes with these uids."""
PROBE_UID = SANDBOX_UIDS.stop
"""Runs ``verify-image``'s and ``doctor``'s probe commands: unprivileged, outside every sandbox's range."""
SUPERVISOR_UID = 65533
"""Runs the container's main process (the watchdog) in every sandbox, so user code cannot signal it."""
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
LABEL_UID = LABEL_PREFIX + "uid"  # the sandbox uid; no two live containers on one engine may share it
LABEL_TAG = LABEL_PREFIX + "tag"  # the operator's CODE_SANDBOX_TAG, when set
LABEL_HOST = LABEL_PREFIX + "host"  # the name of the machine whose server made it, for `reap`
LABEL_RUNTIME = LABEL_PREFIX + "runtime"  # the engine's container runtime it runs under (runc, runsc)

ENVIRONMENT: Mapping[str, str] = {
    "PATH": "/usr/local/bin",
    "HOME": WORKSPACE_DIR,
    "TMPDIR": SCRATCH_DIR,
    "LANG": "C.UTF-8",
}
"""The fixed environment of the container and of every exec; nothing comes from the host."""
UNSEALED_ENVIRONMENT: Mapping[str, str] = {"CODE_SANDBOX_SEAL": "optional"}
"""Added to the container's environment under gVisor, whose kernel does not keep same-uid processes out of a
non-dumpable one: it tells the helpers to run although the seal (:mod:`code_sandbox.image.seal`) cannot hold (the
engine-only trust model believes nothing of the sandbox uid anyway). Helpers never pass it to user code."""

READABLE_RUNTIME_DIR = "/usr/local/gvisor"
"""Where every image also holds its runtime binary and its ELF interpreter readable (mode 0755): gVisor executes only a
binary it can read (google/gvisor#160), so under gVisor every process runs that copy, whose interpreter path names
:data:`READABLE_LOADER`. Under runc (and Podman) an empty read-only tmpfs lies over this directory
(:func:`sealed_dirs`): a process that execs a readable binary is dumpable, and its parent (user code, same uid) could
write native code into it through ``/proc/<pid>/mem``. The path is short so that it fits in the interpreter field of
the runtime's ELF header in place of the original one, and a sibling of ``lib`` under ``/usr/local``, where a runtime
that finds its library by its own location (Python's ``lib/python3.x``) looks."""
READABLE_LOADER = f"{READABLE_RUNTIME_DIR}/ld.so"
"""The readable copy of the runtime's ELF interpreter, which the readable runtime names as its own."""
JAIL_ARCHITECTURES = ("x86_64",)
"""The machines (as ``uname -m`` names them) for which images hold the jail (:mod:`code_sandbox.image.jail`), which
starts each run under gVisor in a PID namespace of its own. Elsewhere gVisor's sandboxes keep the engine-only model."""
ROOT_USER = "0:0"
"""Runs the jailed channel under gVisor (``runner --channel --jailed``), privileged in gVisor's kernel only."""


def environment(*, user_space_kernel: bool) -> dict[str, str]:
    """The environment of a container and of every exec in it under the runtime in force: :data:`ENVIRONMENT`, and
    under gVisor :data:`UNSEALED_ENVIRONMENT` and a ``PATH`` that finds the readable runtime first (a program that
    starts the runtime by name would otherwise meet the unreadable one, which gVisor cannot execute)."""
    if not user_space_kernel:
        return dict(ENVIRONMENT)
    return {**ENVIRONMENT, "PATH": f"{READABLE_RUNTIME_DIR}:{ENVIRONMENT['PATH']}", **UNSEALED_ENVIRONMENT}


def readable_runtime(runtime_path: str) -> str:
    """The readable copy of the image's runtime binary at ``runtime_path``."""
    return f"{READABLE_RUNTIME_DIR}/{runtime_path.rsplit('/', 1)[-1]}"


def with_readable_runtime(argv: Sequence[str], runtime_path: str) -> list[str]:
    """``argv`` with the runtime binary replaced by its readable copy (under gVisor)."""
    if not argv or argv[0] != runtime_path:
        return list(argv)
    return [readable_runtime(runtime_path), *argv[1:]]


PTY_DIR = "/dev/pts"
MQUEUE_DIR = "/dev/mqueue"
SEALED_DIRS = (PTY_DIR, MQUEUE_DIR)
SEALED_TMPFS = "ro,noexec,nosuid,nodev,size=4096,mode=0755"
"""An empty, read-only tmpfs laid over each of :func:`sealed_dirs`, whose contents a sandbox must not reach. Over
:data:`PTY_DIR` it takes away the container's devpts, and with it ``/dev/ptmx`` (a link into it): every pty a sandbox
opened would come from the host's one pool (``kernel.pty.max``, shared by every container), which no cgroup counts.
Over :data:`MQUEUE_DIR` it takes away the mqueue filesystem, where ``open(O_CREAT)`` makes a POSIX message queue
without the system calls the seccomp profile refuses. Over :data:`READABLE_RUNTIME_DIR` (not under gVisor, which
needs it) it takes away the only binaries a sandbox could run dumpable."""


def sealed_dirs(*, user_space_kernel: bool) -> tuple[str, ...]:
    """The directories covered by an empty read-only tmpfs in a container under the runtime in force."""
    return SEALED_DIRS if user_space_kernel else (*SEALED_DIRS, READABLE_RUNTIME_DIR)


def user_of(uid: int) -> str:
    """The ``uid:gid`` string Docker takes for a sandbox uid (the gid is always the same number)."""
    return f"{uid}:{uid}"


def _tmpfs_options(size_bytes: int, inodes: int, uid: int) -> str:
    # nr_inodes: millions of empty files would otherwise cost kernel memory that no byte limit counts.
    return f"rw,noexec,nosuid,nodev,size={size_bytes},nr_inodes={inodes},mode=0700,uid={uid},gid={uid}"


@dataclass(frozen=True)
class Hardening:
    """Resource limits and isolation settings of one sandbox container."""

    memory_bytes: int = limits.MEMORY_BYTES
    nano_cpus: int = limits.CPUS * 1_000_000_000
    pids_limit: int = limits.PROCESSES
    nofile: int = 1024
    workspace_bytes: int = limits.WORKSPACE_BYTES
    scratch_bytes: int = limits.SCRATCH_BYTES
    inodes: int = 8192
    sentry_tasks: int = 1024
    """Under gVisor, the host's PID limit of the container. gVisor's kernel (the sentry) runs as host threads in the
    container's cgroup, a few for each task it runs, and dies if it cannot make one: the limit is set well above what
    :attr:`pids_limit` tasks need, and :attr:`pids_limit` binds the sandbox's tasks inside gVisor instead, as
    ``RLIMIT_NPROC`` of the sandbox uid (the supervisor's few tasks are its own)."""

    def tmpfs(self, uid: int) -> dict[str, str]:
        """The two writable tmpfs mounts, owned by the sandbox uid (:data:`SEALED_TMPFS` mounts come on top)."""
        return {
            WORKSPACE_DIR: _tmpfs_options(self.workspace_bytes, self.inodes, uid),
            SCRATCH_DIR: _tmpfs_options(self.scratch_bytes, self.inodes, uid),
        }

    def security_opt(self, *, apparmor: bool, seccomp: str) -> list[str]:
        """:param seccomp: our profile (:mod:`code_sandbox.seccomp`) as the engine takes it: its JSON text, or on
        Podman the path of a file on the engine's host holding it. "unconfined" is never set."""
        options = ["no-new-privileges:true", f"seccomp={seccomp}"]
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
    uid: int = PROBE_UID
    """The uid that owns the tmpfs mounts and runs every exec that touches them."""
    hardening: Hardening = field(default_factory=Hardening)
    lifeline: bool = False
    """Whether the engine holds the container's stdin open from the moment it is created, and the container (its
    watchdog, told so by its command) ends when that connection closes: when the server is gone, however it went."""
    image_environment: tuple[str, ...] = ()
    """The names of the variables the image's own configuration sets: each is set in the container too, empty unless
    :data:`ENVIRONMENT` gives it a value, so that even an image that slipped past verification adds nothing to a
    sandbox's environment (Docker merges the image's variables into the container's)."""
