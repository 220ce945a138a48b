"""The seccomp profile of every sandbox container: an allowlist of our own, in named groups, each with its reason.

Docker's default profile cannot be extended, only replaced, and a sandbox needs less than it allows: on cgroup v1 the
kernel charges no TCP, UDP or netlink socket buffer to the container's memory cgroup (one sandbox pinned 1.75 GiB of
TCP and 2.2 GiB of UDP memory, more than the host's TCP pressure limit), and a sandbox has no network, so ``socket()``
is allowed for AF_UNIX only. Every system call not named fails with EPERM. The profile is for the native 64-bit ABI of
x86_64 or aarch64 only: the kernel's 32-bit entry points do not match the filter's architecture, so the runtime
refuses them, and ``socketcall()`` and ``ipc()`` never need a rule.

How runc reads it (runc 1.1, libseccomp 2.5): a name this libseccomp does not know is skipped; every call numbered
above the highest name it knows gets ENOSYS, which callers take as "not implemented" and fall back from (clone3,
fchmodat2); every call below that number that is not listed gets EPERM. So every system call up to Linux 6.18 has an
explicit decision here: allowed, refused with ENOSYS (callers probe it and fall back), or refused with EPERM.
gVisor ignores the profile unless runsc runs with ``--oci-seccomp``; its own kernel holds socket memory in the
sandbox's memory. Podman reads ``seccomp=`` as a file on its host (:mod:`code_sandbox.docker_engine.podman` writes one).
"""

from __future__ import annotations

import errno
import functools
import json
from typing import NotRequired, TypedDict

from code_sandbox.seccomp.allowed import AF_UNIX, ALLOWED, CLONE_NAMESPACE_FLAGS
from code_sandbox.seccomp.group import ArgCondition, Group, syscall_names
from code_sandbox.seccomp.refused import REFUSED_ENOLCK, REFUSED_ENOSYS, REFUSED_ENOTSUP, REFUSED_EPERM, REFUSED_NAMED

__all__ = [
    "AF_UNIX",
    "ALLOWED",
    "ARCHES",
    "CLONE_NAMESPACE_FLAGS",
    "REFUSED_ENOLCK",
    "REFUSED_ENOSYS",
    "REFUSED_ENOTSUP",
    "REFUSED_EPERM",
    "REFUSED_NAMED",
    "X86_64_ONLY",
    "ArgCondition",
    "Group",
    "SeccompProfile",
    "SyscallRule",
    "build_profile",
    "check_consistency",
    "profile_text",
]

ARCHES = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}

# Legacy entry points that exist on x86_64 but not in the generic table that aarch64 uses (there, glibc calls the
# *at / *2 / p* forms, which are listed anyway).
X86_64_ONLY = frozenset(
    syscall_names(
        "access alarm arch_prctl chmod chown creat dup2 epoll_create epoll_ctl_old epoll_wait epoll_wait_old "
        "eventfd fork futimesat getdents getpgrp inotify_init ioperm iopl lchown link lstat map_shadow_stack "
        "mkdir mknod modify_ldt open pause pipe poll readlink rename rmdir select signalfd stat symlink sysfs "
        "time unlink uselib ustat utime utimes vfork uretprobe uprobe _sysctl set_thread_area get_thread_area "
        "create_module get_kernel_syms query_module nfsservctl getpmsg putpmsg afs_syscall tuxcall security "
        "vserver"
    )
)


class SyscallRule(TypedDict):
    """One entry of the profile's ``syscalls``: a group's names for one architecture and its decision."""

    names: list[str]
    action: str
    comment: str
    errnoRet: NotRequired[int]
    args: NotRequired[list[ArgCondition]]


class SeccompProfile(TypedDict):
    """The profile as Docker's (and runc's) JSON takes it."""

    defaultAction: str
    defaultErrnoRet: int
    architectures: list[str]
    syscalls: list[SyscallRule]


def _arch_names(names: tuple[str, ...], arch: str) -> list[str]:
    if arch == "x86_64":
        return list(names)
    return [name for name in names if name not in X86_64_ONLY]


def build_profile(architecture: str) -> SeccompProfile:
    """The profile for an engine of ``architecture`` (``x86_64`` or ``aarch64``), as Docker's JSON takes it.

    :raises ValueError: no profile for that architecture (the image build refuses those engines first).
    """
    if architecture not in ARCHES:
        raise ValueError(f"no seccomp profile for architecture {architecture!r}")
    rules: list[SyscallRule] = []
    for group in (*ALLOWED, *REFUSED_NAMED):
        names = _arch_names(group.names, architecture)
        if not names:
            continue
        for conditions in group.condition_sets():
            rule: SyscallRule = {"names": sorted(names), "action": group.action, "comment": group.name}
            if group.errno_ret is not None:
                rule["errnoRet"] = group.errno_ret
            if conditions:
                rule["args"] = [arg.copy() for arg in conditions]
            rules.append(rule)
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": [ARCHES[architecture]],
        "syscalls": rules,
    }


@functools.cache
def profile_text(architecture: str) -> str:
    """:func:`build_profile` as compact JSON text, built once per architecture."""
    return json.dumps(build_profile(architecture), separators=(",", ":"), sort_keys=True)


def check_consistency() -> list[str]:
    """Names decided twice without argument filters (allowed and refused), which would make the profile's meaning
    unclear. Rules with argument filters may share a name: each covers the argument values it names."""
    allowed = {name for group in ALLOWED if group.condition_sets() == ((),) for name in group.names}
    problems: list[str] = []
    for group in (*REFUSED_NAMED, *REFUSED_EPERM):
        if group.condition_sets() != ((),):
            continue
        for name in group.names:
            if name in allowed:
                problems.append(f"{name} is both allowed and refused ({group.name})")
    return problems
