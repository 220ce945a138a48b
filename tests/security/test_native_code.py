"""The seccomp profile read as native code reads it: a program that makes raw system calls (tests/support/native.py)
in a container made as every sandbox is. No language stands between it and the kernel, so what it is refused is what
the profile refuses, and what it gets is what any program could get once it has native code."""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.profile import Profile
from code_sandbox.seccomp import REFUSED_ENOLCK, REFUSED_ENOSYS, REFUSED_ENOTSUP, REFUSED_EPERM
from code_sandbox.seccomp.allowed import F_NOTIFY, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_SETLK, F_SETLKW

from tests.support.native import Blob, Call, NativeSandbox, native_sandbox

pytestmark = [
    pytest.mark.docker,
    pytest.mark.runc_only("the profile is runc's: gVisor does not apply it, and its own kernel answers these calls"),
]

NUMBERS = {
    name: int(number)
    for name, number in (
        line.split() for line in (Path(__file__).parents[1] / "data" / "syscalls_x86_64.txt").read_text().splitlines()
        if not line.startswith("#")
    )
}  # fmt: skip
UPPER = 1 << 32  # a bit of an int argument's register that the kernel does not read
AT_FDCWD = -100
O_RDWR, O_CREAT, O_DIRECTORY = 0o2, 0o100, 0o200000
ACL = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, 0xFFFF_FFFF) for tag, perm in
                                      ((1, 7), (4, 5), (0x20, 5)))  # fmt: skip
"""A POSIX ACL as the kernel takes it in ``system.posix_acl_*``: version 2, owner rwx, group r-x, others r-x."""

BLOB = Blob()
FILE = BLOB.add(b"/workspace/file")
SCRATCH_FILE = BLOB.add(b"/tmp/file")
DIRECTORY = BLOB.add(b"/workspace")
NAMES = {name: BLOB.add(name.encode()) for name in (
    "user.note", "system.posix_acl_access", "system.posix_acl_default", "trusted.note", "security.note",
)}  # fmt: skip
ACL_VALUE = BLOB.add(ACL, terminate=False)
XATTR_ARGS = BLOB.add(struct.pack("<QII", ACL_VALUE, len(ACL), 0), terminate=False)  # struct xattr_args
LOCKS = [BLOB.add(struct.pack("<hhxxxxqqi4x", 1, 0, 2 * n, 1, 0), terminate=False) for n in range(4)]
"""struct flock: F_WRLCK on bytes 0, 2, 4 and 6, so that no lock waits for another if the profile let them through."""
LOCK = LOCKS[0]
BUFFER = BLOB.add(bytes(4096), terminate=False)


def call(name: str, *arguments: int) -> Call:
    return Call(NUMBERS[name], arguments)


@pytest.fixture(scope="module")
def native(engine: DockerEngine, profile: Profile, image_id: str) -> Iterator[NativeSandbox]:
    if engine.daemon_facts().architecture != "x86_64":
        pytest.skip("the prober is x86_64 machine code")
    with native_sandbox(engine, profile, image_id, BLOB.data) as sandbox:
        yield sandbox


def test_the_prober_makes_real_calls(native: NativeSandbox) -> None:
    # A control: allowed calls do what they do, so a refusal below is the profile's, not a broken prober.
    opened, written, uid = native.calls([
        call("openat", AT_FDCWD, FILE, O_RDWR | O_CREAT, 0o600), call("write", 3, FILE, 5), call("getuid"),
    ])  # fmt: skip
    assert (opened, written, uid) == (3, 5, native.uid)


def test_every_call_the_profile_refuses_is_refused_to_native_code(native: NativeSandbox) -> None:
    # Each refused call with arguments of zero, which the filter judges before the kernel reads them. A call the
    # engine's libseccomp is too old to name is above its table and gets ENOSYS instead of EPERM: refused either way.
    expected: dict[str, frozenset[int]] = {}
    for group in REFUSED_EPERM:
        expected.update(dict.fromkeys(group.names, frozenset({errno.EPERM, errno.ENOSYS})))
    for group in REFUSED_ENOSYS:
        expected.update(dict.fromkeys(group.names, frozenset({errno.ENOSYS})))
    expected.update(dict.fromkeys(("setxattr", "lsetxattr", "fsetxattr"), frozenset({errno.ENOTSUP})))
    expected["setxattrat"] = frozenset({errno.ENOTSUP, errno.ENOSYS})
    expected["flock"] = frozenset({errno.ENOLCK})
    names = sorted(name for name in expected if name in NUMBERS)
    assert {group.names for group in (*REFUSED_ENOTSUP, *REFUSED_ENOLCK)} <= {
        ("setxattr", "lsetxattr", "fsetxattr", "setxattrat"),
        ("fcntl",),
        ("flock",),
    }  # a new refused group needs its expectation here
    answers = native.calls([call(name) for name in names])
    wrong = {name: -answer for name, answer in zip(names, answers, strict=True) if -answer not in expected[name]}
    assert wrong == {}
    assert len(names) > 120


def test_an_int_argument_is_judged_by_the_bits_the_kernel_reads(native: NativeSandbox) -> None:
    # The kernel reads an int argument from the low 32 bits of its register. Rules that compared the whole register
    # ("!= PR_SET_SECCOMP", "level != SOL_SOCKET", "option >= 53", "advice != DONTNEED") let a program through with
    # a bit set above them: a BPF filter of its own on a socket, a seccomp filter, a page-cache eviction.
    answers = native.calls([
        call("socket", 1, 1, 0),  # fd 3: a Unix socket
        call("openat", AT_FDCWD, FILE, O_RDWR | O_CREAT, 0o600),  # fd 4
        call("setsockopt", 3, UPPER | 1, 26, BUFFER, 16),  # SOL_SOCKET, SO_ATTACH_FILTER
        call("setsockopt", 3, 1, UPPER | 26, BUFFER, 16),
        call("setsockopt", 3, 1, UPPER | 50, BUFFER, 4),  # SO_ATTACH_BPF
        call("prctl", UPPER | 22, 2, BUFFER),  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        call("fadvise64", 4, 0, 0, UPPER | 4),  # POSIX_FADV_DONTNEED
        call("fcntl", 4, UPPER | F_SETLK, LOCK),
        call("memfd_create", FILE, 8),  # MFD_NOEXEC_SEAL: still mappable as code, and loadable through /proc/self/fd
        call("setsockopt", 3, 1, 7, BUFFER, 4),  # SO_SNDBUF: allowed
        call("fadvise64", 4, 0, 0, 0),  # POSIX_FADV_NORMAL: allowed
    ])  # fmt: skip
    eperm, enolck = -errno.EPERM, -errno.ENOLCK
    assert answers[:2] == [3, 4]
    assert answers[2:9] == [eperm, eperm, eperm, eperm, eperm, enolck, eperm]
    assert answers[9] in (0, -errno.EINVAL) and answers[10] == 0


def test_no_extended_attribute_can_be_set_in_any_name_space(native: NativeSandbox) -> None:
    # On tmpfs an ACL or a user.* attribute is kernel memory the memory cgroup does not count (a 128 KiB block for
    # the largest ACL): every call that sets one is refused, whatever the name space, the file or the call's form.
    calls = [
        call("openat", AT_FDCWD, FILE, O_RDWR | O_CREAT, 0o600),  # fd 3
        call("openat", AT_FDCWD, DIRECTORY, O_DIRECTORY, 0),  # fd 4
        call("openat", AT_FDCWD, SCRATCH_FILE, O_RDWR | O_CREAT, 0o600),  # fd 5
    ]
    sets: list[Call] = []
    for name, address in NAMES.items():
        value, size = (ACL_VALUE, len(ACL)) if "posix_acl" in name else (FILE, 8)
        sets += [
            call("setxattr", FILE, address, value, size, 0),
            call("setxattr", SCRATCH_FILE, address, value, size, 0),
            call("lsetxattr", DIRECTORY, address, value, size, 0),
            call("fsetxattr", 3, address, value, size, 0),
            call("fsetxattr", 4, address, value, size, 0),
        ]
    answers = native.calls(
        [
            *calls,
            *sets,
            call("setxattrat", AT_FDCWD, FILE, 0, NAMES["user.note"], XATTR_ARGS, 16),
            call("flistxattr", 3, BUFFER, 4096),
            call("fgetxattr", 3, NAMES["user.note"], BUFFER, 64),
        ]
    )
    assert answers[:3] == [3, 4, 5]
    assert set(answers[3 : 3 + len(sets)]) == {-errno.ENOTSUP}
    assert answers[-3] in (-errno.ENOTSUP, -errno.ENOSYS)  # setxattrat: a libseccomp that does not name it
    assert answers[-2:] == [0, -errno.ENODATA]  # reading is allowed, and there is nothing to read


def test_no_lock_lease_or_notification_holds_uncharged_kernel_memory(native: NativeSandbox) -> None:
    answers = native.calls([
        call("openat", AT_FDCWD, FILE, O_RDWR | O_CREAT, 0o600),  # fd 3
        call("openat", AT_FDCWD, DIRECTORY, O_DIRECTORY, 0),  # fd 4
        *(call("fcntl", 3, command, lock)
          for command, lock in zip((F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW), LOCKS, strict=True)),
        call("flock", 3, 2),  # LOCK_EX
        call("fcntl", 3, F_SETLEASE, 1),  # F_WRLCK
        call("fcntl", 4, F_NOTIFY, 1),  # DN_ACCESS
        call("fcntl", 3, 5, LOCK),  # F_GETLK: a query, allowed
        call("fcntl", 3, 3),  # F_GETFL: allowed
    ])  # fmt: skip
    enolck, eperm = -errno.ENOLCK, -errno.EPERM
    assert answers[:2] == [3, 4]
    assert answers[2:9] == [enolck, enolck, enolck, enolck, enolck, eperm, eperm]
    assert answers[9] == 0 and answers[10] == O_RDWR | 0o100000  # O_LARGEFILE, as the kernel reports it
