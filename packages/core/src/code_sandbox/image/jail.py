"""The jail: a static 64-bit ELF program that starts a program as a sandbox uid in a process namespace of its own.

Under gVisor the kernel does not keep a process out of another of the same uid, and shows every process's
``/proc/<pid>/fd`` directory to every uid (and opens some of their descriptors), so a program must not see any
process but those of its own run. The supervisor (root in the sandbox, out of reach of the sandbox uid under gVisor's
kernel) starts every program through this jail:

``jail bind``
    once per container: binds the container's root, ``/dev`` and the mounts on it, ``/workspace`` and ``/tmp`` at
    :data:`JAIL_ROOT` (:data:`JAIL_BINDS`)
    (gVisor of 2022 has no mount namespaces: the binds are seen by every process, and change nothing outside), then
    mounts gVisor's cgroup counters, read-only, at :data:`JAIL_COUNTERS` where its kernel has them (a run then reports
    no usage where it has not).
``jail run <uid> <program> [<argument>...]``
    takes off the ``proc`` an earlier jail left at :data:`JAIL_PROC`, then moves the next child into a new PID
    namespace; that child (the namespace's init, root) mounts a ``proc`` of the namespace there, enters
    :data:`JAIL_ROOT` (``chroot``), and starts the program as ``<uid>`` (in a process group of its own, groups
    dropped, gid the same number; gVisor clears every capability as the uid changes), in ``/workspace``, with the
    jail's own environment. The init closes every descriptor but one pipe and reaps; when the program ends it writes
    the program's wait status on that pipe, and it exits once no child is left, which ends the namespace. The jail
    ends as soon as it has the status, as the program did: with its exit code, or killed by the same signal. The
    run's leftovers live on in the namespace until its supervisor kills them (and counts them); killing the jail's
    process group (the jail and the init) ends the run at once.
    Only one jail may live at a time: all of them mount their ``proc`` at the one :data:`JAIL_PROC`.

Inside, ``/proc`` lists the init and the run's own processes only. The program is never root: the jail refuses uid 0.

The program is written here byte by byte, from the instructions below, rather than compiled, as the seal is
(:mod:`code_sandbox.image.seal`): an image build needs no compiler, and ``verify-image`` compares the bytes exactly.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from code_sandbox.hardening import (
    JAIL_ARCHITECTURES,
    READABLE_RUNTIME_DIR,
    SCRATCH_DIR,
    SEALED_DIRS,
    WORKSPACE_DIR,
)
from code_sandbox.image.x86 import R8, R10, R12, R13, R14, R15, RAX, RBP, RBX, RDI, RDX, RSI, RSP, X86

JAIL_PATH = f"{READABLE_RUNTIME_DIR}/jail"
"""Where every image built by ``build-image --offline`` holds the jail: root-owned, mode 0500 (gVisor runs only what it
can read, and no uid but root may run it). Under runc an empty tmpfs lies over its directory."""
JAIL_MODE = 0o500
JAIL_ROOT = f"{READABLE_RUNTIME_DIR}/root"
"""The empty directory of the image where ``jail bind`` puts the container's root, and every run is jailed."""
JAIL_BINDS = tuple(
    (source, JAIL_ROOT + ("" if source == "/" else source))
    for source in ("/", "/dev", *SEALED_DIRS, WORKSPACE_DIR, SCRATCH_DIR)
)
"""Each mount of the container a jail sees, bound at the same place under :data:`JAIL_ROOT`. A bind takes one mount,
not those on top of it: ``/dev``'s own (what lies over ``/dev/pts`` and ``/dev/mqueue``) are bound again, or the jail
would see the directories of gVisor's ``/dev`` under them, which anyone may write files into and run them from."""
JAIL_PROC = f"{JAIL_ROOT}/proc"
JAIL_COUNTERS_DIR = f"{READABLE_RUNTIME_DIR}/counters"
"""An empty directory of the image, root's, mode 0700: no uid but root passes it to the counters' mount in it."""
JAIL_COUNTERS = f"{JAIL_COUNTERS_DIR}/cgroup"
"""The image's empty directory where ``jail bind`` mounts gVisor's cgroup counters, read-only (its ``memory`` and
``cpuacct`` controllers: the sandbox's memory now, its CPU time), which the runner reads around each run. Only root
reaches it (:data:`JAIL_COUNTERS_DIR`), and a jail does not see the mount: its root is a bind of the container's root
alone, without the mounts on top of it."""

EXIT_USAGE = 120
"""The jail's own exit codes, when it did not start a program. A program that started may exit with any code; the
supervisor tells the two apart by what the program itself says once it runs."""
EXIT_BIND = 121
EXIT_UNSHARE = 122
EXIT_LOST = 123
EXIT_SETUP = 124
EXIT_EXEC = 127

LOAD_ADDRESS = 0x40_0000
_EHDR, _PHDR = 64, 56
_HEADERS = _EHDR + 2 * _PHDR

_CLONE_NEWPID = 0x2000_0000
_O_CLOEXEC = 0o2000000
_MS_BIND = 0x1000
_MS_PROC = 2 | 4 | 8  # MS_NOSUID | MS_NODEV | MS_NOEXEC
_MS_COUNTERS = 1 | _MS_PROC  # and MS_RDONLY: not even root writes a limit or moves a task there
_MNT_DETACH = 2
_RLIMIT_NPROC = 6
_PR_CAPBSET_DROP = 24
_CAPABILITIES = 64  # every capability number a kernel may define (an unknown one is refused, and ignored here)
_CAPABILITY_VERSION_3 = 0x2008_0522
_EINTR = 4
_MAX_FD = 256  # every descriptor below this is closed in the jail and the init, but the status pipe's end
_PROC_UNMOUNTS = 16  # a run killed before it unmounted leaves its proc: the next one takes up to this many off
_PROC_SUPER_MAGIC = 0x9FA0
_STATFS_AT = 16  # where on the stack statfs writes (its f_type first), after the pipe and the wait status
_STACK_BYTES = 160

_SYSCALLS = {
    "read": 0, "write": 1, "close": 3, "getpid": 39, "fork": 57, "execve": 59, "wait4": 61, "kill": 62,
    "chdir": 80, "setuid": 105, "setgid": 106, "setpgid": 109, "setgroups": 116, "capset": 126, "prctl": 157,
    "chroot": 161, "mount": 165, "statfs": 137, "umount2": 166, "exit_group": 231, "unshare": 272, "pipe2": 293,
    "prlimit64": 302,
}  # fmt: skip


def _strings() -> tuple[bytes, dict[str, int]]:
    """The jail's constant strings, NUL-terminated, and each one's offset in the blob."""
    names = {"bind": "bind", "run": "run", "proc": "proc", "proc_dir": JAIL_PROC, "root": JAIL_ROOT, "slash": "/"}
    names |= {"cgroup": "cgroup", "counters": JAIL_COUNTERS, "controllers": "memory,cpuacct"}
    names["workspace"] = WORKSPACE_DIR
    for index, (source, target) in enumerate(JAIL_BINDS):
        names[f"bind_source_{index}"] = source
        names[f"bind_target_{index}"] = target
    blob = bytearray()
    offsets: dict[str, int] = {}
    for name, text in names.items():
        offsets[name] = len(blob)
        blob.extend(text.encode() + b"\0")
    return bytes(blob), offsets


def _x86_64_code(string_address: Callable[[str], int]) -> bytes:
    a = X86(_SYSCALLS)
    s = string_address

    # Entry: [rsp] argc, argv at rsp + 8, envp after argv's NULL.
    a.load(R12, RSP, 0)  # argc
    a.lea(R13, RSP, 8)  # argv
    a.imul_imm(R14, R12, 8)
    a.add(R14, R13)
    a.add_imm(R14, 8)  # envp
    a.sub_imm(RSP, _STACK_BYTES)  # [rsp]: the status pipe (two ints); [rsp + 8]: a wait status; then statfs's
    a.cmp_imm(R12, 2)
    a.jcc("l", "usage")
    for mode in ("bind", "run"):  # argv[1] is the mode, whole: nothing else starts either
        a.load(RSI, R13, 8)
        a.mov_imm(RDI, s(mode))
        a.label(f"{mode}_next")
        a.load_byte(RAX, RSI, 0)
        a.load_byte(RDX, RDI, 0)
        a.cmp(RAX, RDX)
        a.jcc("ne", f"{mode}_differs")
        a.test(RAX)
        a.jcc("e", mode)
        a.add_imm(RSI, 1)
        a.add_imm(RDI, 1)
        a.jmp(f"{mode}_next")
        a.label(f"{mode}_differs")
    a.label("usage")
    a.mov_imm(RDI, EXIT_USAGE)
    a.jmp("exit")

    a.label("bind")
    for index in range(len(JAIL_BINDS)):
        a.syscall("mount", s(f"bind_source_{index}"), s(f"bind_target_{index}"), 0, _MS_BIND, 0)
        a.test(RAX)
        a.jcc("ne", "bind_failed")
    a.syscall("mount", s("cgroup"), s("counters"), s("cgroup"), _MS_COUNTERS, s("controllers"))  # failed: no usage
    a.mov_imm(RDI, 0)
    a.jmp("exit")
    a.label("bind_failed")
    a.mov_imm(RDI, EXIT_BIND)
    a.jmp("exit")

    a.label("run")
    a.cmp_imm(R12, 4)
    a.jcc("l", "usage")
    # The uid: 1 to 10 decimal digits, 1 .. 2^32 - 2.
    a.load(RSI, R13, 16)
    a.mov_imm(R15, 0)
    a.mov_imm(RBX, 0)
    a.label("digit")
    a.load_byte(RAX, RSI, 0)
    a.test(RAX)
    a.jcc("e", "parsed")
    a.sub_imm(RAX, ord("0"))
    a.cmp_imm(RAX, 9)
    a.jcc("a", "usage")
    a.imul_imm(R15, R15, 10)
    a.add(R15, RAX)
    a.add_imm(RSI, 1)
    a.add_imm(RBX, 1)
    a.cmp_imm(RBX, 10)
    a.jcc("g", "usage")
    a.jmp("digit")
    a.label("parsed")
    a.test(RBX)
    a.jcc("e", "usage")
    a.test(R15)
    a.jcc("e", "usage")  # never root
    a.mov_imm(RAX, 0)
    a.sub_imm(RAX, 1)  # rax = 2^64 - 1
    a.shr_imm(RAX, 32)  # rax = 2^32 - 1, which is no uid
    a.cmp(R15, RAX)
    a.jcc("ae", "usage")

    a.syscall("unshare", _CLONE_NEWPID)
    a.test(RAX)
    a.jcc("ne", "unshare_failed")

    def rsp_into_rdi() -> None:
        a.mov(RDI, RSP)

    a.syscall("pipe2", rsp_into_rdi, _O_CLOEXEC)
    a.test(RAX)
    a.jcc("ne", "unshare_failed")
    a.call("detach_proc")
    a.syscall("fork")
    a.test(RAX)
    a.jcc("s", "unshare_failed")
    a.jcc("e", "init")

    # The jail: the program's wait status from the init, then end as the program did. The init lives on while the
    # run's leftovers do, so that the supervisor counts and kills them; a kill of the jail's group ends the init too.
    a.load(RBX, RSP, 0, wide=False)  # the pipe's read end
    a.call("close_all_but_rbx")
    a.label("read_status")
    a.mov(RDI, RBX)
    a.lea(RSI, RSP, 8)
    a.mov_imm(RDX, 4)
    a.kernel("read")
    a.cmp_imm(RAX, -_EINTR)
    a.jcc("e", "read_status")
    a.cmp_imm(RAX, 4)
    a.jcc("ne", "lost")
    a.load(R12, RSP, 8, wide=False)
    a.mov(RAX, R12)
    a.and_imm(RAX, 0x7F)
    a.jcc("ne", "signaled")
    a.mov(RDI, R12)
    a.shr_imm(RDI, 8)
    a.and_imm(RDI, 0xFF)
    a.jmp("exit")
    a.label("signaled")
    a.mov(R12, RAX)
    a.syscall("getpid")
    a.mov(RDI, RAX)
    a.mov(RSI, R12)
    a.kernel("kill")
    a.mov(RDI, R12)
    a.add_imm(RDI, 128)
    a.jmp("exit")
    a.label("lost")
    a.mov_imm(RDI, EXIT_LOST)
    a.jmp("exit")
    a.label("unshare_failed")
    a.mov_imm(RDI, EXIT_UNSHARE)
    a.jmp("exit")

    # The init: pid 1 of the new namespace, still root.
    a.label("init")
    a.syscall("mount", s("proc"), s("proc_dir"), s("proc"), _MS_PROC, 0)
    a.test(RAX)
    a.jcc("ne", "init_failed")
    a.syscall("chroot", s("root"))
    a.test(RAX)
    a.jcc("ne", "init_failed")
    a.syscall("chdir", s("slash"))
    a.test(RAX)
    a.jcc("ne", "init_failed")
    # No capability is left to bound anything later: the program starts with none it could ever regain, and the init
    # drops the ones it holds once the program is forked (it only reaps and writes after that).
    a.mov_imm(R12, 0)
    a.label("bound_next")

    def capability() -> None:
        a.mov(RSI, R12)

    a.syscall("prctl", _PR_CAPBSET_DROP, capability)
    a.add_imm(R12, 1)
    a.cmp_imm(R12, _CAPABILITIES)
    a.jcc("b", "bound_next")
    a.syscall("fork")
    a.test(RAX)
    a.jcc("s", "init_failed")
    a.jcc("e", "program")
    a.mov(RBP, RAX)
    a.mov_imm(RAX, _CAPABILITY_VERSION_3)
    a.store(RSP, _STATFS_AT, RAX)  # the header: version, pid 0 (this process)
    for offset in (8, 16, 24):  # two sets of effective, permitted, inheritable: all empty
        a.mov_imm(RAX, 0)
        a.store(RSP, _STATFS_AT + offset, RAX)

    def header() -> None:
        a.lea(RDI, RSP, _STATFS_AT)

    def data() -> None:
        a.lea(RSI, RSP, _STATFS_AT + 8)

    a.syscall("capset", header, data)
    a.test(RAX)
    a.jcc("ne", "init_failed")
    a.load(RBX, RSP, 4, wide=False)  # the pipe's write end
    a.call("close_all_but_rbx")
    a.label("reap")
    a.mov_imm(RDI, -1)
    a.lea(RSI, RSP, 8)
    a.mov_imm(RDX, 0)
    a.mov_imm(R10, 0)
    a.kernel("wait4")
    a.cmp(RAX, RBP)
    a.jcc("e", "reported")
    a.test(RAX)
    a.jcc("ns", "reap")  # an orphan of the run, reaped
    a.cmp_imm(RAX, -_EINTR)
    a.jcc("e", "reap")
    a.mov_imm(RDI, 0)  # no child left (ECHILD): the namespace ends with this exit
    a.jmp("exit")
    a.label("init_failed")
    a.mov_imm(RDI, EXIT_LOST)
    a.jmp("exit")
    a.label("reported")  # the program's status to the jail, once; then on reaping until no child is left
    a.mov(RDI, RBX)
    a.lea(RSI, RSP, 8)
    a.mov_imm(RDX, 4)
    a.kernel("write")
    a.mov_imm(RBP, 0)
    a.jmp("reap")

    # The program's process: a process group of its own in the jail's session, the sandbox uid, in /workspace, then
    # the program. Its group has an ancestor (the init, of the jail's group, in the same session), so it is never an
    # orphaned group: gVisor sends SIGHUP and SIGCONT to every process of an orphaned group that has a stopped one
    # whenever any of them exits, which would wake (or end) a paused evaluation context as its children are killed.
    a.label("program")
    a.syscall("setpgid", 0, 0)
    a.test(RAX)
    a.jcc("ne", "setup_failed")

    # gVisor counts a task against its uid's RLIMIT_NPROC by the uid it was made with: this one, made by root, is not
    # counted, so the program may make one task more than the limit. Both of its values go one down here.
    def rlimit_buffer() -> None:
        a.lea(R10, RSP, _STATFS_AT)

    a.syscall("prlimit64", 0, _RLIMIT_NPROC, 0, rlimit_buffer)
    a.test(RAX)
    a.jcc("ne", "setup_failed")
    for offset in (0, 8):  # rlim_cur, rlim_max: above zero and finite (RLIM_INFINITY is all ones), one less
        a.load(RAX, RSP, _STATFS_AT + offset)
        a.test(RAX)
        a.jcc("e", "setup_failed")
        a.mov_imm(RDX, -1)
        a.cmp(RAX, RDX)
        a.jcc("e", "setup_failed")
        a.sub_imm(RAX, 1)
        a.store(RSP, _STATFS_AT + offset, RAX)

    def rlimit_new() -> None:
        a.lea(RDX, RSP, _STATFS_AT)

    a.syscall("prlimit64", 0, _RLIMIT_NPROC, rlimit_new, 0)
    a.test(RAX)
    a.jcc("ne", "setup_failed")
    a.syscall("setgroups", 0, 0)
    a.test(RAX)
    a.jcc("ne", "setup_failed")

    def uid_into(register: int) -> Callable[[], None]:
        return lambda: a.mov(register, R15)

    a.syscall("setgid", uid_into(RDI))
    a.test(RAX)
    a.jcc("ne", "setup_failed")
    a.syscall("setuid", uid_into(RDI))
    a.test(RAX)
    a.jcc("ne", "setup_failed")
    a.syscall("chdir", s("workspace"))
    a.test(RAX)
    a.jcc("ne", "setup_failed")
    a.load(RDI, R13, 24)
    a.lea(RSI, R13, 24)
    a.mov(RDX, R14)
    a.kernel("execve")
    a.mov_imm(RDI, EXIT_EXEC)
    a.jmp("exit")
    a.label("setup_failed")
    a.mov_imm(RDI, EXIT_SETUP)

    a.label("exit")  # exit_group(rdi)
    a.kernel("exit_group")

    # close(fd) for every fd below _MAX_FD but rbx. Uses r8.
    a.label("close_all_but_rbx")
    a.mov_imm(R8, 0)
    a.label("close_next")
    a.cmp(R8, RBX)
    a.jcc("e", "close_skip")
    a.mov(RDI, R8)
    a.kernel("close")
    a.label("close_skip")
    a.add_imm(R8, 1)
    a.cmp_imm(R8, _MAX_FD)
    a.jcc("b", "close_next")
    a.ret()

    # While a proc is what lies at proc_dir, umount2(proc_dir, MNT_DETACH), at most _PROC_UNMOUNTS times. gVisor
    # unmounts the mount that holds a path which is no mount point of its own, so the file system's type is asked
    # first: below the procs lies the bound root. Uses r8; the caller's stack is one return address deeper.
    a.label("detach_proc")
    a.mov_imm(R8, _PROC_UNMOUNTS)
    a.label("detach_next")

    def statfs_buffer() -> None:
        a.lea(RSI, RSP, _STATFS_AT + 8)

    a.syscall("statfs", s("proc_dir"), statfs_buffer)
    a.test(RAX)
    a.jcc("ne", "detach_done")
    a.load(RAX, RSP, _STATFS_AT + 8)
    a.cmp_imm(RAX, _PROC_SUPER_MAGIC)
    a.jcc("ne", "detach_done")
    a.syscall("umount2", s("proc_dir"), _MNT_DETACH)
    a.test(RAX)
    a.jcc("ne", "detach_done")
    a.sub_imm(R8, 1)
    a.jcc("ne", "detach_next")
    a.label("detach_done")
    a.ret()
    return a.resolve()


def jail_program(architecture: str) -> bytes | None:
    """The jail for ``architecture``; ``None`` for one it is not written for (:data:`JAIL_ARCHITECTURES`)."""
    if architecture not in JAIL_ARCHITECTURES or architecture != "x86_64":
        return None
    strings, offsets = _strings()
    # Two passes: the code's length places the strings, and the strings' addresses are immediates of fixed size.
    code = _x86_64_code(lambda name: 0)
    base = LOAD_ADDRESS + _HEADERS + len(code)
    code = _x86_64_code(lambda name: base + offsets[name])
    if base != LOAD_ADDRESS + _HEADERS + len(code):
        raise ValueError("the jail's code changed length between its two passes")
    body = code + strings
    size = _HEADERS + len(body)
    entry = LOAD_ADDRESS + _HEADERS
    header = struct.pack(
        "<4sBBBBB7xHHIQQQIHHHHHH",
        b"\x7fELF", 2, 1, 1, 0, 0,  # 64-bit, little-endian, version 1, System V ABI
        2, 62, 1,  # ET_EXEC, x86_64
        entry, _EHDR, 0, 0, _EHDR, _PHDR, 2, 64, 0, 0,
    )  # fmt: skip
    load = struct.pack("<IIQQQQQQ", 1, 4 | 1, 0, LOAD_ADDRESS, LOAD_ADDRESS, size, size, 0x1000)  # PT_LOAD, R+X
    stack = struct.pack("<IIQQQQQQ", 0x6474E551, 4 | 2, 0, 0, 0, 0, 0, 16)  # PT_GNU_STACK, RW: no executable stack
    return header + load + stack + body
