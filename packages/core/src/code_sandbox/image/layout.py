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
"Under gVisor")."""
READABLE_RUNTIME_MODE = 0o755
"""The readable copy's mode: the same bytes, which the build's digest label covers too."""
IMAGE_PATH = ENVIRONMENT["PATH"]
IMAGE_CONFIG = ImageConfig(env=(f"PATH={IMAGE_PATH}",), working_dir=WORKSPACE_DIR)
"""The image's whole configuration as the build writes it (and its user, :data:`SUPERVISOR_USER`): no entrypoint,
command, health check, volume, port, ``ONBUILD``, stop signal or shell, and no variable but ``PATH``."""
DOCKERFILE = f"FROM scratch\nCOPY rootfs/ /\nUSER {SUPERVISOR_USER}\nENV PATH={IMAGE_PATH}\nWORKDIR {WORKSPACE_DIR}\n"
BUILDER_LABELS = frozenset({"io.buildah.version"})
"""Labels an engine's builder adds to every image it builds (Podman's: the buildah version), which say nothing about
how a container starts."""
RUNTIME_DIGEST_LABEL = LABEL_PREFIX + "runtime.sha256"
"""The sha256 of the runtime binary the build put in the image."""
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
