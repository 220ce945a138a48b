"""The system calls every sandbox is refused, in named groups, each with its reason: those refused with ENOSYS, which
callers probe and fall back from, and those refused with EPERM, the profile's default for every call not named."""

from __future__ import annotations

import errno

from code_sandbox.seccomp.allowed import FCNTL_LOCKS
from code_sandbox.seccomp.group import Group, int_is, syscall_names

REFUSED_ENOSYS: tuple[Group, ...] = (
    Group(
        "clone3-enosys",
        "clone3 passes its flags in memory, which seccomp cannot read, so namespace flags could not be refused. "
        "ENOSYS makes glibc (2.34+) and others fall back to clone(2), whose flags are filtered "
        "(clone-without-namespaces); EPERM would make thread and process creation fail outright.",
        ("clone3",),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOSYS,
    ),
    Group(
        "io-uring-enosys",
        "io_uring is a large, frequently vulnerable kernel surface that bypasses the per-syscall filter (its "
        "operations are not system calls). libuv probes io_uring_setup and falls back to its thread pool on "
        "ENOSYS.",
        syscall_names("io_uring_setup io_uring_enter io_uring_register"),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOSYS,
    ),
    Group(
        "linux-aio-enosys",
        "Linux AIO (io_setup ...): unused by the runtimes we know, and its contexts count against the host-wide "
        "fs.aio-max-nr, so one sandbox could exhaust it for the host's databases.",
        syscall_names("io_setup io_destroy io_submit io_cancel io_getevents io_pgetevents"),
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
        syscall_names(
            "landlock_create_ruleset landlock_add_rule landlock_restrict_self memfd_secret cachestat statmount "
            "listmount lsm_get_self_attr lsm_set_self_attr lsm_list_modules file_getattr file_setattr "
            "set_mempolicy_home_node process_mrelease"
        ),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOSYS,
    ),
)

REFUSED_ENOTSUP: tuple[Group, ...] = (
    Group(
        "xattr-writes-enotsup",
        "Setting an extended attribute, in any name space and by any of the four calls. On tmpfs (the workspace and "
        "/tmp) a POSIX ACL or a user.* attribute is kernel memory that the memory cgroup does not count on cgroup v1: "
        "an ACL of 8,191 entries pins a 128 KiB block, and one sandbox pinned 4,108 MiB of the host's slab while its "
        "cgroup grew 3.4 MiB. ENOTSUP is what a file system without extended attributes answers, which copiers "
        "(Python's shutil.copy2, cp -a, tar) take as 'nothing to copy'; EPERM would fail some of them.",
        syscall_names("setxattr lsetxattr fsetxattr setxattrat"),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOTSUP,
    ),
)

REFUSED_ENOLCK: tuple[Group, ...] = (
    Group(
        "fcntl-locks-enolck",
        "Record locks (fcntl F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW): see fcntl-without-locks. ENOLCK is what "
        "the kernel answers when it has no lock to give; SQLite reports it as 'database is locked' (a database file "
        "opened as file:<name>?vfs=unix-none, or one in memory, takes no lock).",
        ("fcntl",),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOLCK,
        alternatives=tuple((int_is(1, command),) for command in FCNTL_LOCKS),
    ),
    Group(
        "flock-enolck",
        "flock(2) holds one lock per open file in the same uncharged slab; nothing in a sandbox shares its files "
        "with another program that would need the lock.",
        ("flock",),
        action="SCMP_ACT_ERRNO",
        errno_ret=errno.ENOLCK,
    ),
)

REFUSED_NAMED: tuple[Group, ...] = (*REFUSED_ENOSYS, *REFUSED_ENOTSUP, *REFUSED_ENOLCK)
"""The refused groups the profile names, each with its errno; the rest fall to the default action."""

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
        syscall_names(
            "unshare setns mount umount2 pivot_root chroot fsopen fsconfig fsmount fspick move_mount open_tree "
            "open_tree_attr mount_setattr"
        ),
    ),
    Group(
        "debugging-other-processes",
        "ptrace, process_vm_readv/writev, pidfd_getfd, process_madvise and kcmp act on another process's memory or "
        "files; the sandbox's helpers run under the same uid as user code in some paths and rely on being "
        "non-dumpable, and nothing in a sandbox needs a debugger.",
        syscall_names("ptrace process_vm_readv process_vm_writev pidfd_getfd process_madvise kcmp"),
    ),
    Group(
        "kernel-keyring",
        "keyctl/add_key/request_key: the keyring is not namespaced and has a history of bugs.",
        syscall_names("keyctl add_key request_key"),
    ),
    Group(
        "posix-message-queues",
        "mq_*: the container has a private IPC namespace (ipc_mode none) so queues are reachable without "
        "/dev/mqueue, bounded only by RLIMIT_MSGQUEUE; nothing needs them.",
        syscall_names("mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr"),
    ),
    Group(
        "sysv-ipc",
        "System V shared memory, semaphores and message queues: unused by the runtimes we know (multiprocessing uses "
        "POSIX semaphores in /dev/shm, which ipc_mode none removes anyway).",
        syscall_names("shmget shmat shmdt shmctl semget semop semtimedop semctl msgget msgsnd msgrcv msgctl"),
    ),
    Group(
        "memfd",
        "memfd_create: a memfd is writable memory that may be mapped executable whatever its seals (MFD_NOEXEC_SEAL "
        "stops execve alone): a program writes a shared object into one and loads it through /proc/self/fd "
        "(LD_PRELOAD of a runtime it starts), which is native code in a runtime that has none (the Python example "
        "profile without ctypes), around the noexec mounts of /workspace and /tmp. Nothing in a sandbox needs one.",
        ("memfd_create",),
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
        syscall_names("perf_event_open bpf fanotify_init fanotify_mark lookup_dcookie"),
    ),
    Group(
        "host-administration",
        "Kernel modules, kexec, reboot, swap, accounting, quotas, the kernel log, hostname, clock setting, raw "
        "port I/O, NUMA policy of pages: all need capabilities this container does not have or affect the host.",
        syscall_names(
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
        syscall_names("name_to_handle_at open_by_handle_at"),
    ),
    Group(
        "credentials",
        "set*id, setgroups, setfs*id and capset: without capabilities they cannot change anything a sandbox could use.",
        syscall_names("setuid setgid setreuid setregid setresuid setresgid setgroups setfsuid setfsgid capset"),
    ),
    Group(
        "host-wide-sync",
        "sync/syncfs flush every filesystem of the host (syncfs on the overlay root reaches the host's disk); "
        "files on tmpfs need no flushing, and fsync/fdatasync stay allowed.",
        syscall_names("sync syncfs sync_file_range readahead"),
    ),
    Group(
        "legacy-or-dangerous-misc",
        "modify_ldt (16-bit segments, historically buggy), remap_file_pages (deprecated), vmsplice (zero-copy "
        "of user pages into pipes, the basis of several kernel bugs), epoll_*_old, the 32-bit TLS calls "
        "set_thread_area/get_thread_area (x86_64 code uses arch_prctl), and never-implemented slots.",
        syscall_names(
            "modify_ldt remap_file_pages vmsplice epoll_ctl_old epoll_wait_old set_thread_area get_thread_area "
            "getpmsg putpmsg afs_syscall tuxcall security vserver"
        ),
    ),
)
