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
from dataclasses import dataclass
from typing import Any

ARCHES = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}

# Socket address families and protocols (include/linux/socket.h, include/uapi/linux/netlink.h).
AF_UNIX = 1
AF_NETLINK = 16

# Namespace flags of clone(2) (include/uapi/linux/sched.h). CLONE_NEWTIME (0x80) is not here: in clone(2) that bit
# belongs to the exit-signal byte, and only clone3/unshare accept CLONE_NEWTIME, both refused below.
CLONE_NEWNS = 0x0002_0000
CLONE_NEWCGROUP = 0x0200_0000
CLONE_NEWUTS = 0x0400_0000
CLONE_NEWIPC = 0x0800_0000
CLONE_NEWUSER = 0x1000_0000
CLONE_NEWPID = 0x2000_0000
CLONE_NEWNET = 0x4000_0000
CLONE_NAMESPACE_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
)

# memfd_create(2) flags (include/uapi/linux/memfd.h, Linux 6.3+).
MFD_NOEXEC_SEAL = 0x0008
MFD_EXEC = 0x0010

# Socket options (include/uapi/asm-generic/socket.h), prctl options, fadvise advice.
SOL_SOCKET = 1
PR_SET_SECCOMP = 22
POSIX_FADV_DONTNEED = 4

# personality(2): PER_LINUX, and the query value (0xffffffff) that only reads the current persona.
PER_LINUX = 0x0000
PERSONALITY_QUERY = 0xFFFF_FFFF


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


# Legacy entry points that exist on x86_64 but not in the generic table that aarch64 uses (there, glibc calls the
# *at / *2 / p* forms, which are listed anyway).
X86_64_ONLY = frozenset(
    _names(
        "access alarm arch_prctl chmod chown creat dup2 epoll_create epoll_ctl_old epoll_wait epoll_wait_old "
        "eventfd fork futimesat getdents getpgrp inotify_init ioperm iopl lchown link lstat map_shadow_stack "
        "mkdir mknod modify_ldt open pause pipe poll readlink rename rmdir select signalfd stat symlink sysfs "
        "time unlink uselib ustat utime utimes vfork uretprobe uprobe _sysctl set_thread_area get_thread_area "
        "create_module get_kernel_syms query_module nfsservctl getpmsg putpmsg afs_syscall tuxcall security "
        "vserver"
    )
)


@dataclass(frozen=True)
class Group:
    """A set of system calls with one decision and the reason for it."""

    name: str
    why: str
    names: tuple[str, ...]
    action: str = "SCMP_ACT_ALLOW"
    errno_ret: int | None = None
    args: tuple[dict[str, int | str], ...] = ()


ALLOWED: tuple[Group, ...] = (
    Group(
        "process-lifecycle",
        "Start programs and end them: execve for the runtime and the processes it starts; exit and wait for children; "
        "thread-start bookkeeping that glibc does for every thread (set_tid_address, robust futex list, rseq). "
        "fork/vfork carry no flags, so no namespace can be asked for through them.",
        _names(
            "execve execveat exit exit_group wait4 waitid fork vfork set_tid_address set_robust_list "
            "get_robust_list rseq restart_syscall arch_prctl"
        ),
    ),
    Group(
        "clone-without-namespaces",
        "clone(2) is how glibc makes threads and (with posix_spawn) processes. Its flags are a plain register, so the "
        "filter refuses any call that asks for a new namespace (user namespaces need no capability, and would "
        "give the program CAP_SYS_ADMIN over a new mount/net/pid namespace and a far larger kernel surface).",
        ("clone",),
        args=({"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"},),
    ),
    Group(
        "signals",
        "Signal handling and delivery; kill/tgkill reach only processes of the same uid (no CAP_KILL), and a "
        "sandbox's uid is its own. pidfd_open/pidfd_send_signal are race-free forms of the same checks (Python's "
        "os.pidfd_open, asyncio's PidfdChildWatcher).",
        _names(
            "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigsuspend rt_sigtimedwait rt_sigqueueinfo "
            "rt_tgsigqueueinfo sigaltstack kill tkill tgkill pause alarm pidfd_open pidfd_send_signal"
        ),
    ),
    Group(
        "identity-and-sessions",
        "Reading who we are, process groups and sessions (shells, tini's job control, detached children). "
        "The set*id family is left out: without CAP_SETUID/CAP_SETGID it can only shuffle ids the process already "
        "has, which a sandbox never needs.",
        _names(
            "getpid getppid gettid getuid geteuid getgid getegid getresuid getresgid getgroups getpgid getpgrp "
            "getsid setpgid setsid capget"
        ),
    ),
    Group(
        "memory",
        "Address-space management for the allocator, a JIT's heap and JIT (mprotect to flip code pages), Python's "
        "arenas and mmap module. All of it is charged to the container's memory cgroup; mlock is bounded by "
        "RLIMIT_MEMLOCK. membarrier is used by JITs and lock-free runtimes; mseal only removes the caller's own "
        "options; map_shadow_stack is glibc's CET shadow stack (x86_64).",
        _names(
            "brk mmap munmap mprotect mremap madvise msync mincore mlock mlock2 munlock mlockall munlockall "
            "membarrier mseal map_shadow_stack"
        ),
    ),
    Group(
        "memory-protection-keys",
        "V8 can use protection keys (x86 PKU) to write-protect JIT code between compilations; a key only changes "
        "the caller's own page permissions.",
        _names("pkey_alloc pkey_free pkey_mprotect"),
    ),
    Group(
        "memfd-noexec-only",
        "memfd_create is allowed only with MFD_NOEXEC_SEAL (and without MFD_EXEC): an executable memfd would let a "
        "program write an ELF file into memory and execve or dlopen it through /proc/self/fd, around the noexec "
        "mounts of /workspace and /tmp. The memory is shmem, charged to the memory cgroup. Other flags fail with "
        "EPERM (Python's os.memfd_create(name) with default flags among them).",
        ("memfd_create",),
        args=(
            {"index": 1, "value": MFD_NOEXEC_SEAL | MFD_EXEC, "valueTwo": MFD_NOEXEC_SEAL, "op": "SCMP_CMP_MASKED_EQ"},
        ),
    ),
    Group(
        "file-io",
        "Reading, writing and seeking open files, including the zero-copy helpers that libuv's fs.copyFile and "
        "Python's shutil use (copy_file_range, sendfile, splice, tee). All of it is bounded by the tmpfs sizes, "
        "the read-only root and file permissions.",
        _names(
            "read write readv writev pread64 pwrite64 preadv pwritev lseek close close_range dup "
            "dup2 dup3 fcntl flock fsync fdatasync ftruncate truncate fallocate copy_file_range "
            "sendfile splice tee"
        ),
    ),
    Group(
        "file-io-without-flags",
        "preadv2/pwritev2 only with no flags: RWF_NOWAIT tells whether a page is in the page cache, and the image's "
        "files are shared by every sandbox, so it would show which pages another sandbox touches.",
        _names("preadv2 pwritev2"),
        args=({"index": 5, "value": 0, "op": "SCMP_CMP_EQ"},),
    ),
    Group(
        "fadvise-without-eviction",
        "fadvise64 with any advice but POSIX_FADV_DONTNEED (4), which evicts pages of those shared files: with a "
        "timed read, the other half of the same side channel.",
        ("fadvise64",),
        args=({"index": 3, "value": POSIX_FADV_DONTNEED, "op": "SCMP_CMP_NE"},),
    ),
    Group(
        "paths-and-metadata",
        "Opening and creating files and directories, stat, links, permissions, timestamps, extended attributes. "
        "chown/mknod without capabilities can only give a file to the owner's own groups and make FIFOs "
        "(os.mkfifo); the kernel refuses device nodes. Python's shutil.copy2 reads and writes xattrs and treats "
        "EPERM as a hard error, so the xattr calls are allowed (the *at forms arrived in 6.13).",
        _names(
            "open openat openat2 creat stat fstat lstat newfstatat statx statfs fstatfs access faccessat faccessat2 "
            "getdents getdents64 getcwd chdir fchdir mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 "
            "link linkat symlink symlinkat readlink readlinkat chmod fchmod fchmodat fchmodat2 chown fchown fchownat "
            "lchown umask utime utimes utimensat futimesat mknod mknodat "
            "getxattr lgetxattr fgetxattr getxattrat listxattr llistxattr flistxattr listxattrat setxattr lsetxattr "
            "fsetxattr setxattrat removexattr lremovexattr fremovexattr removexattrat"
        ),
    ),
    Group(
        "file-watching",
        "fs.watch (libuv) and watchdog-style libraries use inotify; instances and watches are counted per uid "
        "(fs.inotify.max_user_*), and each sandbox has its own uid.",
        _names("inotify_init inotify_init1 inotify_add_watch inotify_rm_watch"),
    ),
    Group(
        "ioctl",
        "Terminals (a pty from /dev/ptmx: TIOCGWINSZ, TCGETS, TIOCSPTLCK, TIOCGPTN), FIONBIO/FIOCLEX, and file "
        "ioctls. The command space is too large to list; device ioctls are bounded by the few devices Docker "
        "gives a container, and privileged ones need capabilities this container does not have.",
        ("ioctl",),
    ),
    Group(
        "event-loop",
        "libuv's and asyncio's event loops: epoll, poll/select, eventfd, timerfd, signalfd, pipes, and every "
        "futex form (futex_waitv, and futex_wait/wake/requeue of 6.7) for locks and condition variables.",
        _names(
            "epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 poll ppoll select pselect6 "
            "eventfd eventfd2 timerfd_create timerfd_settime timerfd_gettime signalfd signalfd4 pipe pipe2 futex "
            "futex_waitv futex_wait futex_wake futex_requeue"
        ),
    ),
    Group(
        "time",
        "Clocks, sleeps, interval and POSIX timers (a runtime's timers, Python's time and signal.setitimer). "
        "Setting the clock needs CAP_SYS_TIME and is left out, as is adjtimex/clock_adjtime, which nothing needs.",
        _names(
            "clock_gettime clock_getres clock_nanosleep nanosleep gettimeofday time times getitimer setitimer "
            "timer_create timer_settime timer_gettime timer_getoverrun timer_delete"
        ),
    ),
    Group(
        "scheduling",
        "CPU affinity (os.availableParallelism, glibc's nproc, libuv's thread pool size), yielding, and priorities. "
        "Without CAP_SYS_NICE a process can only lower its own priority or change its own affinity within its "
        "cpuset.",
        _names(
            "sched_yield sched_getaffinity sched_setaffinity sched_getparam sched_setparam sched_getscheduler "
            "sched_setscheduler sched_getattr sched_setattr sched_get_priority_max sched_get_priority_min "
            "sched_rr_get_interval getpriority setpriority getcpu"
        ),
    ),
    Group(
        "resources-and-system-info",
        "Limits (a runtime raises its own RLIMIT_NOFILE soft limit to the hard one at startup; raising a hard limit "
        "needs CAP_SYS_RESOURCE), usage counters, uname/sysinfo for the os module, getrandom for crypto and "
        "hash seeds, prctl for thread names, PR_SET_PDEATHSIG, no_new_privs and dumpability of the caller itself.",
        _names("getrlimit setrlimit prlimit64 getrusage sysinfo uname getrandom"),
    ),
    Group(
        "prctl-without-seccomp",
        "prctl for thread names, PR_SET_PDEATHSIG, no_new_privs and the caller's own dumpability (the helpers' "
        "seal), but not PR_SET_SECCOMP: see the seccomp group among the refused.",
        ("prctl",),
        args=({"index": 0, "value": PR_SET_SECCOMP, "op": "SCMP_CMP_NE"},),
    ),
    Group(
        "personality-query-only",
        "personality(2) only to read the persona or set plain PER_LINUX: other personas switch off ASLR "
        "(ADDR_NO_RANDOMIZE) or make mmap(PROT_READ) executable (READ_IMPLIES_EXEC) for the process and what it "
        "execs.",
        ("personality",),
        args=({"index": 0, "value": PER_LINUX, "op": "SCMP_CMP_EQ"},),
    ),
    Group(
        "personality-query-only",
        "(second value; see above)",
        ("personality",),
        args=({"index": 0, "value": PERSONALITY_QUERY, "op": "SCMP_CMP_EQ"},),
    ),
    Group(
        "unix-sockets",
        "socket() for AF_UNIX only (next groups): net.createServer().listen('/tmp/x.sock'), IPC channels of "
        "child_process (socketpair), multiprocessing. Unix-socket buffers are charged to the memory cgroup "
        "(measured), unlike TCP/UDP/netlink buffers on cgroup v1. The calls on an existing socket need no "
        "filter: only AF_UNIX sockets can exist.",
        _names(
            "bind listen accept accept4 connect getsockname getpeername getsockopt sendto recvfrom "
            "sendmsg recvmsg sendmmsg recvmmsg shutdown"
        ),
    ),
    Group(
        "setsockopt-not-socket-level",
        "setsockopt at any level but SOL_SOCKET (a Unix socket has no other that does anything).",
        ("setsockopt",),
        args=({"index": 1, "value": SOL_SOCKET, "op": "SCMP_CMP_NE"},),
    ),
    Group(
        "setsockopt-below-filters",
        "SOL_SOCKET options 1 to 25 (buffers, timeouts, SO_PASSCRED, SO_REUSEADDR and the like). Options 26 to "
        "52 are refused: SO_ATTACH_FILTER (26), SO_ATTACH_BPF (50) and "
        "SO_ATTACH_REUSEPORT_CBPF/EBPF (51, 52) attach BPF programs, about half of whose memory no cgroup counts "
        "and whose JIT code draws on the host-wide bpf_jit_limit; the rest between them mean nothing to a Unix "
        "socket.",
        ("setsockopt",),
        args=({"index": 1, "value": SOL_SOCKET, "op": "SCMP_CMP_EQ"}, {"index": 2, "value": 25, "op": "SCMP_CMP_LE"}),
    ),
    Group(
        "setsockopt-above-filters",
        "SOL_SOCKET options from 53 on (newer ones; none attaches a program).",
        ("setsockopt",),
        args=({"index": 1, "value": SOL_SOCKET, "op": "SCMP_CMP_EQ"}, {"index": 2, "value": 53, "op": "SCMP_CMP_GE"}),
    ),
    Group(
        "socket-af-unix",
        "socket(AF_UNIX, any type, any protocol).",
        ("socket",),
        args=({"index": 0, "value": AF_UNIX, "op": "SCMP_CMP_EQ"},),
    ),
    Group(
        "socketpair-af-unix",
        "socketpair() exists only for AF_UNIX in practice; the filter says so.",
        ("socketpair",),
        args=({"index": 0, "value": AF_UNIX, "op": "SCMP_CMP_EQ"},),
    ),
    Group(
        "uprobe-trampolines",
        "uretprobe/uprobe (x86_64, 6.11+) are only ever called from trampolines the kernel inserts when the host "
        "attaches probes (bpftrace, perf); refusing them would crash a traced process. Recent kernels let them "
        "bypass seccomp anyway.",
        _names("uretprobe uprobe"),
    ),
)

REFUSED_ENOSYS: tuple[Group, ...] = (
    Group(
        "clone3-enosys",
        "clone3 passes its flags in memory, which seccomp cannot read, so namespace flags could not be refused. "
        "ENOSYS makes glibc (2.34+) and others fall back to clone(2), whose flags are filtered above; EPERM "
        "would make thread and process creation fail outright.",
        ("clone3",),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOSYS,
    ),
    Group(
        "io-uring-enosys",
        "io_uring is a large, frequently vulnerable kernel surface that bypasses the per-syscall filter (its "
        "operations are not system calls). libuv probes io_uring_setup and falls back to its thread pool on "
        "ENOSYS.",
        _names("io_uring_setup io_uring_enter io_uring_register"),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOSYS,
    ),
    Group(
        "linux-aio-enosys",
        "Linux AIO (io_setup ...): unused by the runtimes we know, and its contexts count against the host-wide "
        "fs.aio-max-nr, so one sandbox could exhaust it for the host's databases.",
        _names("io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents"),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOSYS,
    ),
    Group(
        "new-and-unneeded-enosys",
        "Recent calls that nothing in the sandbox uses and whose callers treat ENOSYS as 'not available': "
        "landlock (a program sandboxing itself further is harmless but unneeded), memfd_secret (secretmem, "
        "unmovable memory), cachestat (page-cache residency of files: a side channel), statmount/listmount "
        "(mount-table walkers), lsm_* (LSM attributes), file_getattr/file_setattr (6.17; the ioctl forms stay), "
        "set_mempolicy_home_node, process_mrelease.",
        _names(
            "landlock_create_ruleset landlock_add_rule landlock_restrict_self memfd_secret cachestat statmount "
            "listmount lsm_get_self_attr lsm_set_self_attr lsm_list_modules file_getattr file_setattr "
            "set_mempolicy_home_node process_mrelease"
        ),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOSYS,
    ),
)

# Refused with the default EPERM. They are not emitted (the default action covers them); the list documents the
# decision and lets a test check that no allowed group names one of them.
REFUSED_EPERM: tuple[Group, ...] = (
    Group(
        "seccomp-filters",
        "seccomp(2) and prctl(PR_SET_SECCOMP): a filter only restricts its caller further, but each is a BPF program "
        "whose JIT code draws on the host-wide bpf_jit_limit, which runc needs to filter every new container; "
        "thousands of stacked filters would exhaust it for the host.",
        ("seccomp",),
    ),
    Group(
        "network-sockets",
        "socket()/socketpair() of any family but AF_UNIX: AF_INET, AF_INET6, AF_PACKET, AF_VSOCK, AF_ALG and "
        "AF_NETLINK (every protocol, NETLINK_ROUTE included). On cgroup v1 TCP/UDP buffers escape the memory "
        "limit (1.75 GiB TCP, 2.2 GiB UDP measured from one sandbox), and so do netlink receive queues: 50 "
        "NETLINK_ROUTE sockets with SO_RCVBUF at net.core.rmem_max and unread RTM_GETLINK replies pinned 275 MiB "
        "of slab while the container's memcg grew by 0.2 MiB (REPORT.md). The product has no network in a "
        "sandbox. EPERM (the default) rather than ENOSYS: a runtime then reports 'uv_interface_addresses returned "
        "EPERM' from os.networkInterfaces() and 'connect EPERM' from net/fetch; with ENOSYS its message for "
        "os.networkInterfaces() is empty ('undefined returned undefined').",
        (),
        action="SCMP_ACT_ERRNO",
    ),
    Group(
        "namespaces-and-mounts",
        "unshare/setns and the mount family: a user namespace needs no capability and would open the mount, "
        "net and pid namespace code to the program; the rest needs CAP_SYS_ADMIN anyway.",
        _names(
            "unshare setns mount umount2 pivot_root chroot fsopen fsconfig fsmount fspick move_mount open_tree "
            "open_tree_attr mount_setattr"
        ),
    ),
    Group(
        "debugging-other-processes",
        "ptrace, process_vm_readv/writev, pidfd_getfd, process_madvise and kcmp act on another process's memory or "
        "files; the sandbox's helpers run under the same uid as user code in some paths and rely on being "
        "non-dumpable, and nothing in a sandbox needs a debugger.",
        _names("ptrace process_vm_readv process_vm_writev pidfd_getfd process_madvise kcmp"),
    ),
    Group(
        "kernel-keyring",
        "keyctl/add_key/request_key: the keyring is not namespaced and has a history of bugs.",
        _names("keyctl add_key request_key"),
    ),
    Group(
        "posix-message-queues",
        "mq_*: the container has a private IPC namespace (ipc_mode none) so queues are reachable without "
        "/dev/mqueue, bounded only by RLIMIT_MSGQUEUE; nothing needs them.",
        _names("mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr"),
    ),
    Group(
        "sysv-ipc",
        "System V shared memory, semaphores and message queues: unused by the runtimes we know (multiprocessing uses "
        "POSIX semaphores in /dev/shm, which ipc_mode none removes anyway).",
        _names("shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl"),
    ),
    Group(
        "userfaultfd",
        "userfaultfd lets a program stall kernel code that touches its memory, the standard tool for widening "
        "kernel race windows in exploits.",
        ("userfaultfd",),
    ),
    Group(
        "tracing-and-bpf",
        "perf_event_open and bpf: large kernel surfaces and side channels; both need capabilities or permissive "
        "sysctls for anything useful.",
        _names("perf_event_open bpf fanotify_init fanotify_mark lookup_dcookie"),
    ),
    Group(
        "host-administration",
        "Kernel modules, kexec, reboot, swap, accounting, quotas, the kernel log, hostname, clock setting, raw "
        "port I/O, NUMA policy of pages: all need capabilities this container does not have or affect the host.",
        _names(
            "init_module finit_module delete_module kexec_load kexec_file_load reboot swapon swapoff acct quotactl "
            "quotactl_fd syslog sethostname setdomainname settimeofday clock_settime clock_adjtime adjtimex iopl "
            "ioperm vhangup mbind set_mempolicy get_mempolicy migrate_pages move_pages ioprio_set ioprio_get "
            "_sysctl sysfs ustat uselib nfsservctl create_module get_kernel_syms query_module"
        ),
    ),
    Group(
        "file-handles",
        "name_to_handle_at leaks file handles of the host filesystem; open_by_handle_at needs "
        "CAP_DAC_READ_SEARCH and was the 'shocker' container escape.",
        _names("name_to_handle_at open_by_handle_at"),
    ),
    Group(
        "credentials",
        "set*id, setgroups, setfs*id and capset: without capabilities they cannot change anything a sandbox could use.",
        _names("setuid setgid setreuid setregid setresuid setresgid setgroups setfsuid setfsgid capset"),
    ),
    Group(
        "host-wide-sync",
        "sync/syncfs flush every filesystem of the host (syncfs on the overlay root reaches the host's disk); "
        "files on tmpfs need no flushing, and fsync/fdatasync stay allowed.",
        _names("sync syncfs sync_file_range readahead"),
    ),
    Group(
        "legacy-or-dangerous-misc",
        "modify_ldt (16-bit segments, historically buggy), remap_file_pages (deprecated), vmsplice (zero-copy "
        "of user pages into pipes, the basis of several kernel bugs), epoll_*_old, the 32-bit TLS calls "
        "set_thread_area/get_thread_area (x86_64 code uses arch_prctl), and never-implemented slots.",
        _names(
            "modify_ldt remap_file_pages vmsplice epoll_ctl_old epoll_wait_old set_thread_area get_thread_area "
            "getpmsg putpmsg afs_syscall tuxcall security vserver"
        ),
    ),
)


def _arch_names(names: tuple[str, ...], arch: str) -> list[str]:
    if arch == "x86_64":
        return list(names)
    return [name for name in names if name not in X86_64_ONLY]


def build_profile(architecture: str) -> dict[str, Any]:
    """The profile for an engine of ``architecture`` (``x86_64`` or ``aarch64``), as Docker's JSON takes it.

    :raises ValueError: no profile for that architecture (the image build refuses those engines first).
    """
    if architecture not in ARCHES:
        raise ValueError(f"no seccomp profile for architecture {architecture!r}")
    rules: list[dict[str, Any]] = []
    for group in (*ALLOWED, *REFUSED_ENOSYS):
        names = _arch_names(group.names, architecture)
        if not names:
            continue
        rule: dict[str, Any] = {"names": sorted(names), "action": group.action, "comment": group.name}
        if group.errno_ret is not None:
            rule["errnoRet"] = group.errno_ret
        if group.args:
            rule["args"] = [dict(arg) for arg in group.args]
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
    allowed = {name for group in ALLOWED if not group.args for name in group.names}
    problems: list[str] = []
    for group in (*REFUSED_ENOSYS, *REFUSED_EPERM):
        if group.args:
            continue
        for name in group.names:
            if name in allowed:
                problems.append(f"{name} is both allowed and refused ({group.name})")
    return problems
