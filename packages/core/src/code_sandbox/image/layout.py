"""What the offline build writes into a sandbox image, and so what verification expects of one: the files every
image holds besides the profile's, its configuration, its labels, and the manifest lines both sides compare."""

from __future__ import annotations

from code_sandbox.engine import ImageConfig
from code_sandbox.hardening import (
    ENVIRONMENT,
    LABEL_PREFIX,
    SUPERVISOR_UID,
    SUPERVISOR_USER,
    WORKSPACE_DIR,
)

# Names that must not exist anywhere in the image: shells, system package managers and privilege tools. A profile
# adds its runtime's own package managers (ImageSpec.forbidden_names).
FORBIDDEN_NAMES = frozenset(
    {"sh", "bash", "dash", "ash", "zsh", "ksh", "csh", "busybox", "apt", "apt-get", "dpkg", "apk", "rpm", "yum",
     "dnf", "su", "sudo", "doas", "env"}
)  # fmt: skip

PASSWD = (
    "root:x:0:0:root:/nonexistent:/nonexistent\n"
    f"supervisor:x:{SUPERVISOR_UID}:{SUPERVISOR_UID}:supervisor:/nonexistent:/nonexistent\n"
)
GROUP = f"root:x:0:\nsupervisor:x:{SUPERVISOR_UID}:\n"
RUNTIME_MODE = 0o711
"""Root-owned and unreadable: the kernel then makes every process that execs the runtime non-dumpable from its first
instruction, so code in a sandbox cannot open another process's ``/proc/<pid>/fd`` or ``mem``, nor ptrace it, even
under its own uid. The seal (:mod:`code_sandbox.image.seal`) is a second layer. gVisor cannot execute such a binary (it
needs read permission to load it): under gVisor every process runs the readable copy instead
(:data:`~code_sandbox.hardening.READABLE_RUNTIME_DIR`), and the host believes nothing of the sandbox uid (SECURITY.md,
"Under gVisor"). The runtime's ELF interpreter has this mode too: run directly, it would otherwise be a dumpable
process whose memory its parent could write."""
FILE_MODE_IN_IMAGE = 0o444
"""Every other file of the image (libraries, helpers, the seal): readable and not executable, so that no process of a
sandbox runs a binary it can read (one that does is dumpable, and its parent of the same uid could write native code
into it through ``/proc/<pid>/mem``). The dynamic loader maps libraries without needing their execute bit."""
READABLE_RUNTIME_MODE = 0o755
"""The mode of the readable copies under :data:`~code_sandbox.hardening.READABLE_RUNTIME_DIR`: the runtime, naming
:data:`~code_sandbox.hardening.READABLE_LOADER` as its interpreter (its digest is in :data:`READABLE_DIGEST_LABEL`),
and the interpreter itself."""
INIT_DIR = "/sbin"
INIT_DIR_MODE = 0o710
"""Where Docker mounts its init (``--init``: the engine host's static ``docker-init``, readable and executable by all).
The container's first process runs it as the supervisor; a sandbox uid must not: a process that runs a binary it can
read is dumpable, and its parent, user code of the same uid, could write native code into it through
``/proc/<pid>/mem``. So the image holds this directory as root's, group the supervisor's, mode 0710: the supervisor
may pass through it, a sandbox uid may not."""


def image_gid(path: str) -> int:
    """The group of an image entry: root's, but :data:`INIT_DIR`'s."""
    return SUPERVISOR_UID if path == INIT_DIR else 0


IMAGE_PATH = ENVIRONMENT["PATH"]
IMAGE_CONFIG = ImageConfig(env=(f"PATH={IMAGE_PATH}",), working_dir=WORKSPACE_DIR)
"""The image's whole configuration as the build writes it (and its user, :data:`SUPERVISOR_USER`): no entrypoint,
command, health check, volume, port, ``ONBUILD``, stop signal or shell, and no variable but ``PATH``."""
DOCKERFILE = (
    f"FROM scratch\nCOPY rootfs/ /\nCOPY --chown=0:{SUPERVISOR_UID} init/ /\nUSER {SUPERVISOR_USER}\n"
    f"ENV PATH={IMAGE_PATH}\nWORKDIR {WORKSPACE_DIR}\n"
)
"""COPY makes every entry root's whatever the context says; the second COPY gives :data:`INIT_DIR` its group."""
BUILDER_LABELS = frozenset({"io.buildah.version"})
"""Labels an engine's builder adds to every image it builds (Podman's: the buildah version), which say nothing about
how a container starts."""
RUNTIME_DIGEST_LABEL = LABEL_PREFIX + "runtime.sha256"
"""The sha256 of the runtime binary the build put in the image."""
READABLE_DIGEST_LABEL = LABEL_PREFIX + "runtime.readable.sha256"
"""The sha256 of its readable copy, which differs from it in the interpreter path alone."""
FILES_LABEL = LABEL_PREFIX + "files"
"""The build's manifest: one line per entry of the image outside the package tree (which its own labels cover), as
``kind mode uid:gid sha256 path``, sorted. ``verify-image`` compares the exported tree with it: nothing extra, nothing
changed."""
ENGINE_MADE = frozenset(
    {"/.dockerenv", "/dev", "/dev/console", "/dev/pts", "/dev/shm", "/etc/hostname", "/etc/hosts",  # noqa: S108
     "/etc/mtab", "/etc/resolv.conf", "/proc", "/sys", "/run", "/run/.containerenv", "/var", "/var/tmp"}  # noqa: S108
)  # fmt: skip
"""Entries that Docker or Podman put in every container's tree (mount points, empty files it later mounts over, the
``/etc/mtab`` link): in an export, each must be a directory, an empty file or that link, and nothing more."""


def manifest_line(path: str, kind: str, mode: int, uid: int, gid: int, sha256: str | None, link: str = "") -> str:
    line = f"{kind} {mode:04o} {uid}:{gid} {sha256 or '-'} {path}"
    return f"{line} -> {link}" if link else line


def path_of(line: str) -> str:
    return line.split(" ", 4)[-1].split(" -> ")[0]


def under(path: str, root: str | None) -> bool:
    return root is not None and (path == root or path.startswith(root + "/"))
