"""The system calls every sandbox may make, in named groups, each with its reason, and the argument filters that
narrow some of them (sockets for AF_UNIX only, clone without namespaces, fcntl without locks); the kernel's constants
those filters compare with are here too. :mod:`code_sandbox.seccomp` builds the profile from them."""

from __future__ import annotations

from code_sandbox.seccomp.group import LOW_32_BITS, Group, int_in, int_is, int_is_not, syscall_names

# Socket address families and protocols (include/linux/socket.h, include/uapi/linux/netlink.h).
AF_UNIX = 1
AF_NETLINK = 16

# Namespace flags of clone(2) (include/uapi/linux/sched.h). CLONE_NEWTIME (0x80) is not here: in clone(2) that bit
# belongs to the exit-signal byte, and only clone3/unshare accept CLONE_NEWTIME, both refused (seccomp_refused).
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

# fcntl(2) commands that take a record lock, a lease or a directory notification (include/uapi/asm-generic/fcntl.h,
# include/uapi/linux/fcntl.h).
F_SETLK = 6
F_SETLKW = 7
F_OFD_SETLK = 37
F_OFD_SETLKW = 38
F_SETLEASE = 1024
F_NOTIFY = 1026
FCNTL_LOCKS = (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW)

# Socket options (include/uapi/asm-generic/socket.h), prctl options, fadvise advice.
SOL_SOCKET = 1
PR_SET_SECCOMP = 22
POSIX_FADV_DONTNEED = 4

# personality(2): PER_LINUX, and the query value (0xffffffff) that only reads the current persona.
PER_LINUX = 0x0000
PERSONALITY_QUERY = 0xFFFF_FFFF

ALLOWED: tuple[Group, ...] = (
    Group(
        "process-lifecycle",
        "Start programs and end them: execve for the runtime and the processes it starts; exit and wait for children; "
        "thread-start bookkeeping that glibc does for every thread (set_tid_address, robust futex list, rseq). "
        "fork/vfork carry no flags, so no namespace can be asked for through them.",
        syscall_names(
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
        syscall_names(
            "rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigsuspend rt_sigtimedwait rt_sigqueueinfo "
            "rt_tgsigqueueinfo sigaltstack kill tkill tgkill pause alarm pidfd_open pidfd_send_signal"
        ),
    ),
    Group(
        "identity-and-sessions",
        "Reading who we are, process groups and sessions (shells, tini's job control, detached children). "
        "The set*id family is left out: without CAP_SETUID/CAP_SETGID it can only shuffle ids the process already "
        "has, which a sandbox never needs.",
        syscall_names(
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
        syscall_names(
            "brk mmap munmap mprotect mremap madvise msync mincore mlock mlock2 munlock mlockall munlockall "
            "membarrier mseal map_shadow_stack"
        ),
    ),
    Group(
        "memory-protection-keys",
        "V8 can use protection keys (x86 PKU) to write-protect JIT code between compilations; a key only changes "
        "the caller's own page permissions.",
        syscall_names("pkey_alloc pkey_free pkey_mprotect"),
    ),
    Group(
        "file-io",
        "Reading, writing and seeking open files, including the zero-copy helpers that libuv's fs.copyFile and "
        "Python's shutil use (copy_file_range, sendfile, splice, tee). All of it is bounded by the tmpfs sizes, "
        "the read-only root and file permissions.",
        syscall_names(
            "read write readv writev pread64 pwrite64 preadv pwritev lseek close close_range dup "
            "dup2 dup3 fsync fdatasync ftruncate truncate fallocate copy_file_range sendfile splice tee"
        ),
    ),
    Group(
        "fcntl-without-locks",
        "fcntl for flags, descriptors, pipe sizes, seals and lock queries, but not to take a record lock (F_SETLK, "
        "F_SETLKW and their OFD forms; fcntl-locks-enolck), a lease (F_SETLEASE) or a directory notification "
        "(F_NOTIFY): the kernel keeps each lock, lease and notification in slab memory it has not charged to a "
        "memory cgroup since Linux 6.8, and byte-range locks on one file are unbounded in number (50,000 pinned "
        "9.4 MiB of slab while the sandbox's cgroup grew 1.9 MiB).",
        ("fcntl",),
        alternatives=(
            *int_in(1, 0, F_SETLK - 1),
            *int_in(1, F_SETLKW + 1, F_OFD_SETLK - 1),
            *int_in(1, F_OFD_SETLKW + 1, F_SETLEASE - 1),
            (int_is(1, F_SETLEASE + 1),),
            *int_in(1, F_NOTIFY + 1, LOW_32_BITS),
        ),
    ),
    Group(
        "file-io-without-flags",
        "preadv2/pwritev2 only with no flags: RWF_NOWAIT tells whether a page is in the page cache, and the image's "
        "files are shared by every sandbox, so it would show which pages another sandbox touches.",
        syscall_names("preadv2 pwritev2"),
        args=({"index": 5, "value": 0, "op": "SCMP_CMP_EQ"},),
    ),
    Group(
        "fadvise-without-eviction",
        "fadvise64 with any advice but POSIX_FADV_DONTNEED (4), which evicts pages of those shared files: with a "
        "timed read, the other half of the same side channel.",
        ("fadvise64",),
        alternatives=int_is_not(3, POSIX_FADV_DONTNEED),
    ),
    Group(
        "paths-and-metadata",
        "Opening and creating files and directories, stat, links, permissions, timestamps, reading and removing "
        "extended attributes (setting one is refused: xattr-writes-enotsup). chown/mknod without capabilities can "
        "only give a file to the owner's own groups and make FIFOs (os.mkfifo); the kernel refuses device nodes. "
        "The *xattrat forms arrived in 6.13.",
        syscall_names(
            "open openat openat2 creat stat fstat lstat newfstatat statx statfs fstatfs access faccessat faccessat2 "
            "getdents getdents64 getcwd chdir fchdir mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 "
            "link linkat symlink symlinkat readlink readlinkat chmod fchmod fchmodat fchmodat2 chown fchown fchownat "
            "lchown umask utime utimes utimensat futimesat mknod mknodat "
            "getxattr lgetxattr fgetxattr getxattrat listxattr llistxattr flistxattr listxattrat removexattr "
            "lremovexattr fremovexattr removexattrat"
        ),
    ),
    Group(
        "file-watching",
        "fs.watch (libuv) and watchdog-style libraries use inotify; instances and watches are counted per uid "
        "(fs.inotify.max_user_*), and each sandbox has its own uid.",
        syscall_names("inotify_init inotify_init1 inotify_add_watch inotify_rm_watch"),
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
        syscall_names(
            "epoll_create epoll_create1 epoll_ctl epoll_wait epoll_pwait epoll_pwait2 poll ppoll select pselect6 "
            "eventfd eventfd2 timerfd_create timerfd_settime timerfd_gettime signalfd signalfd4 pipe pipe2 futex "
            "futex_waitv futex_wait futex_wake futex_requeue"
        ),
    ),
    Group(
        "time",
        "Clocks, sleeps, interval and POSIX timers (a runtime's timers, Python's time and signal.setitimer). "
        "Setting the clock needs CAP_SYS_TIME and is left out, as is adjtimex/clock_adjtime, which nothing needs.",
        syscall_names(
            "clock_gettime clock_getres clock_nanosleep nanosleep gettimeofday time times getitimer setitimer "
            "timer_create timer_settime timer_gettime timer_getoverrun timer_delete"
        ),
    ),
    Group(
        "scheduling",
        "CPU affinity (os.availableParallelism, glibc's nproc, libuv's thread pool size), yielding, and priorities. "
        "Without CAP_SYS_NICE a process can only lower its own priority or change its own affinity within its "
        "cpuset.",
        syscall_names(
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
        syscall_names("getrlimit setrlimit prlimit64 getrusage sysinfo uname getrandom"),
    ),
    Group(
        "prctl-without-seccomp",
        "prctl for thread names, PR_SET_PDEATHSIG, no_new_privs and the caller's own dumpability (the helpers' "
        "seal), but not PR_SET_SECCOMP: see the seccomp group among the refused.",
        ("prctl",),
        alternatives=int_is_not(0, PR_SET_SECCOMP),
    ),
    *(  # one rule for each argument value allowed: a rule's conditions must all hold
        Group(
            "personality-query-only",
            "personality(2) only to read the persona or set plain PER_LINUX: other personas switch off ASLR "
            "(ADDR_NO_RANDOMIZE) or make mmap(PROT_READ) executable (READ_IMPLIES_EXEC) for the process and what it "
            "execs.",
            ("personality",),
            args=({"index": 0, "value": persona, "op": "SCMP_CMP_EQ"},),
        )
        for persona in (PER_LINUX, PERSONALITY_QUERY)
    ),
    Group(
        "unix-sockets",
        "socket() for AF_UNIX only (next groups): net.createServer().listen('/tmp/x.sock'), IPC channels of "
        "child_process (socketpair), multiprocessing. Unix-socket buffers are charged to the memory cgroup "
        "(measured), unlike TCP/UDP/netlink buffers on cgroup v1. The calls on an existing socket need no "
        "filter: only AF_UNIX sockets can exist.",
        syscall_names(
            "bind listen accept accept4 connect getsockname getpeername getsockopt sendto recvfrom "
            "sendmsg recvmsg sendmmsg recvmmsg shutdown"
        ),
    ),
    Group(
        "setsockopt-not-socket-level",
        "setsockopt at any level but SOL_SOCKET (a Unix socket has no other that does anything).",
        ("setsockopt",),
        alternatives=int_is_not(1, SOL_SOCKET),
    ),
    Group(
        "setsockopt-below-filters",
        "SOL_SOCKET options 1 to 25 (buffers, timeouts, SO_PASSCRED, SO_REUSEADDR and the like). Options 26 to "
        "52 are refused: SO_ATTACH_FILTER (26), SO_ATTACH_BPF (50) and "
        "SO_ATTACH_REUSEPORT_CBPF/EBPF (51, 52) attach BPF programs, about half of whose memory no cgroup counts "
        "and whose JIT code draws on the host-wide bpf_jit_limit; the rest between them mean nothing to a Unix "
        "socket.",
        ("setsockopt",),
        alternatives=tuple((int_is(1, SOL_SOCKET), *block) for block in int_in(2, 0, 25)),
    ),
    Group(
        "setsockopt-above-filters",
        "SOL_SOCKET options from 53 on (newer ones; none attaches a program).",
        ("setsockopt",),
        alternatives=tuple((int_is(1, SOL_SOCKET), *block) for block in int_in(2, 53, LOW_32_BITS)),
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
        syscall_names("uretprobe uprobe"),
    ),
)
