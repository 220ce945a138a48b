"""Our seccomp profile, read as data: what it allows, with which arguments, and what it refuses. That the engine
applies it is shown by the hardening snapshot (tests/test_sessions.py) and the attacks in tests/security."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from code_sandbox.seccomp import (
    AF_UNIX,
    ALLOWED,
    CLONE_NAMESPACE_FLAGS,
    REFUSED_EPERM,
    REFUSED_NAMED,
    ArgCondition,
    SyscallRule,
    build_profile,
    check_consistency,
    profile_text,
)
from code_sandbox.seccomp.group import int_in, int_is_not

REFUSED = frozenset(
    {
        "keyctl",
        "add_key",
        "request_key",
        "mq_open",
        "mq_timedsend",
        "mq_notify",
        "shmget",
        "semget",
        "msgget",
        "userfaultfd",
        "perf_event_open",
        "bpf",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "unshare",
        "setns",
        "mount",
        "pivot_root",
        "open_by_handle_at",
        "name_to_handle_at",
        "kexec_load",
        "init_module",
        "syslog",
        "acct",
        "swapon",
        "fanotify_init",
        "vmsplice",
        "modify_ldt",
    }
)


def _rules(architecture: str) -> list[SyscallRule]:
    return list(build_profile(architecture)["syscalls"])


@pytest.mark.parametrize("architecture", ["x86_64", "aarch64"])
def test_everything_unnamed_is_refused_and_only_the_native_abi_is_listed(architecture: str) -> None:
    profile = build_profile(architecture)
    assert (profile["defaultAction"], profile["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", errno.EPERM)
    assert profile["architectures"] == [{"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}[architecture]]
    assert check_consistency() == []
    assert json.loads(profile_text(architecture)) == profile


@pytest.mark.parametrize("architecture", ["x86_64", "aarch64"])
def test_sockets_are_allowed_for_af_unix_alone(architecture: str) -> None:
    for name in ("socket", "socketpair"):
        rules = [rule for rule in _rules(architecture) if name in rule["names"]]
        assert len(rules) == 1 and rules[0]["action"] == "SCMP_ACT_ALLOW", rules
        assert rules[0].get("args") == [{"index": 0, "value": AF_UNIX, "op": "SCMP_CMP_EQ"}]


@pytest.mark.parametrize("architecture", ["x86_64", "aarch64"])
def test_kernel_objects_no_cgroup_counts_are_refused(architecture: str) -> None:
    allowed = {name for rule in _rules(architecture) if rule["action"] == "SCMP_ACT_ALLOW"
               for name in rule["names"]}  # fmt: skip
    assert allowed.isdisjoint(REFUSED)
    not_implemented = {name for rule in _rules(architecture) if rule.get("errnoRet") == errno.ENOSYS
                       for name in rule["names"]}  # fmt: skip
    assert {"io_uring_setup", "io_uring_enter", "io_setup", "clone3"} <= not_implemented


def test_clone_may_not_ask_for_a_namespace() -> None:
    (rule,) = [rule for rule in _rules("x86_64") if "clone" in rule["names"]]
    assert rule.get("args") == [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]


def test_an_architecture_without_a_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="no seccomp profile"):
        build_profile("riscv64")


def _allowing(name: str) -> list[list[ArgCondition]]:
    """The argument conditions of each rule that allows ``name`` (an empty list: allowed whatever its arguments)."""
    return [list(rule.get("args", [])) for rule in _rules("x86_64")
            if name in rule["names"] and rule["action"] == "SCMP_ACT_ALLOW"]  # fmt: skip


def test_no_socket_option_can_attach_a_bpf_program() -> None:
    # SO_ATTACH_FILTER (26), SO_ATTACH_BPF (50), SO_ATTACH_REUSEPORT_CBPF/EBPF (51, 52): about half of a filter's
    # memory is charged to no cgroup, and its JIT code draws on the host-wide bpf_jit_limit.
    rules = _allowing("setsockopt")
    assert [] not in rules
    for option in (26, 50, 51, 52):
        for level, name in ((1, option), (UPPER | 1, option), (1, UPPER | option)):
            assert not any(_matches(rule, {1: level, 2: name}) for rule in rules), (level, name)
    for option in (7, 8, 16, 20, 21, 53, 60):  # SO_SNDBUF, SO_RCVBUF, SO_PASSCRED, the timeouts, newer ones
        assert any(_matches(rule, {1: 1, 2: option}) for rule in rules), option
    assert _allowed("setsockopt", {1: 6, 2: 26})  # another level (IPPROTO_TCP): nothing there attaches a program


def test_no_filter_of_its_own_and_no_page_cache_probe() -> None:
    assert _allowing("seccomp") == []  # not allowed at all
    assert not _allowed("prctl", {0: 22}) and not _allowed("prctl", {0: UPPER | 22})  # PR_SET_SECCOMP
    assert _allowed("prctl", {0: 4}) and _allowed("prctl", {0: 15})  # PR_SET_DUMPABLE (the seal), PR_SET_NAME
    for name in ("preadv2", "pwritev2"):
        assert [_matches(rule, {5: 8}) for rule in _allowing(name)] == [False]  # RWF_NOWAIT
        assert [_matches(rule, {5: UPPER | 8}) for rule in _allowing(name)] == [False]
        assert [_matches(rule, {5: 0}) for rule in _allowing(name)] == [True]
    assert not _allowed("fadvise64", {3: 4}) and not _allowed("fadvise64", {3: UPPER | 4})  # POSIX_FADV_DONTNEED
    assert _allowed("fadvise64", {3: 0}) and _allowed("fadvise64", {3: 2})  # NORMAL, SEQUENTIAL


def _matches(conditions: list[ArgCondition], arguments: dict[int, int]) -> bool:
    """Whether a call with ``arguments`` (index -> the whole 64-bit register) meets every condition of one rule."""
    tests: dict[str, Callable[[int, ArgCondition], bool]] = {
        "SCMP_CMP_EQ": lambda argument, condition: argument == condition["value"],
        "SCMP_CMP_NE": lambda argument, condition: argument != condition["value"],
        "SCMP_CMP_LE": lambda argument, condition: argument <= condition["value"],
        "SCMP_CMP_GE": lambda argument, condition: argument >= condition["value"],
        "SCMP_CMP_MASKED_EQ": lambda argument, condition: argument & condition["value"] == condition.get("valueTwo"),
    }
    return all(tests[condition["op"]](arguments[condition["index"]], condition) for condition in conditions)


def _allowed(name: str, arguments: dict[int, int]) -> bool:
    return any(_matches(rule, arguments) for rule in _allowing(name))


def _refused_with(name: str, arguments: dict[int, int]) -> int | None:
    """The errno of the refusing rule that a call matches, if one does."""
    for rule in _rules("x86_64"):
        if name in rule["names"] and rule["action"] == "SCMP_ACT_ERRNO" and _matches(list(rule.get("args", [])),
                                                                                        arguments):  # fmt: skip
            return rule.get("errnoRet")
    return None


# Arguments the kernel declares int (or unsigned int): it reads their low 32 bits alone.
INT_ARGUMENTS = {("prctl", 0), ("fadvise64", 3), ("setsockopt", 1), ("setsockopt", 2), ("fcntl", 1), ("socket", 0),
                 ("socketpair", 0), ("personality", 0), ("preadv2", 5), ("pwritev2", 5),
                 ("memfd_create", 1)}  # fmt: skip
UPPER = 1 << 32


@pytest.mark.parametrize("architecture", ["x86_64", "aarch64"])
def test_no_rule_reads_an_int_argument_by_bits_the_kernel_ignores(architecture: str) -> None:
    # A whole-register "!=", "<=" or ">=" on an int argument is decided by its upper 32 bits, which the kernel drops:
    # prctl(1 << 32 | PR_SET_SECCOMP) passed "!= 22". Only equality of the whole register (set upper bits fail it)
    # or a comparison of masked low bits can judge one.
    for rule in _rules(architecture):
        for condition in rule.get("args", []):
            if any((name, condition["index"]) in INT_ARGUMENTS for name in rule["names"]):
                masked_low = condition["op"] == "SCMP_CMP_MASKED_EQ" and condition["value"] < UPPER
                assert condition["op"] == "SCMP_CMP_EQ" or masked_low, (rule["comment"], condition)
    assert all((name, index) in INT_ARGUMENTS or name == "clone"  # clone's flags are an unsigned long
               for rule in _rules(architecture) for name in rule["names"]
               for index in (condition["index"] for condition in rule.get("args", [])))  # fmt: skip


def test_every_call_of_the_kernel_has_a_decision() -> None:
    table = Path(__file__).parent / "data" / "syscalls_x86_64.txt"
    names = {line.split()[0] for line in table.read_text().splitlines() if not line.startswith("#")}
    decided = {name for group in (*ALLOWED, *REFUSED_NAMED, *REFUSED_EPERM)
               for name in group.names}  # fmt: skip
    assert names - decided == set() and decided - names == set()


def test_extended_attributes_can_be_read_and_removed_but_never_set() -> None:
    for name in ("setxattr", "lsetxattr", "fsetxattr", "setxattrat"):
        assert _allowing(name) == [] and _refused_with(name, {}) == errno.ENOTSUP
    for name in ("getxattr", "listxattr", "flistxattr", "removexattr", "fremovexattr"):
        assert _allowing(name) == [[]]


@pytest.mark.parametrize(("command", "refused"), [
    (6, errno.ENOLCK), (7, errno.ENOLCK), (37, errno.ENOLCK), (38, errno.ENOLCK),  # record locks
    (1024, errno.EPERM), (1026, errno.EPERM),  # F_SETLEASE, F_NOTIFY: the default
    (UPPER | 6, errno.ENOLCK), (UPPER | 1024, errno.EPERM),
    (0, None), (1, None), (3, None), (4, None), (5, None), (36, None), (1025, None), (1030, None), (1031, None),
    (1033, None), (0xFFFF_FFFF, None),  # F_DUPFD, F_GETFD, F_GETFL, F_SETFL, F_GETLK, F_OFD_GETLK, F_GETLEASE,
])  # fmt: skip  # F_DUPFD_CLOEXEC, F_SETPIPE_SZ, F_ADD_SEALS, an unknown command (EINVAL from the kernel)
def test_fcntl_takes_no_lock_lease_or_notification(command: int, refused: int | None) -> None:
    assert _allowed("fcntl", {1: command}) is (refused is None)
    if refused == errno.ENOLCK:
        assert _refused_with("fcntl", {1: command}) == errno.ENOLCK
    assert _refused_with("flock", {}) == errno.ENOLCK


def test_int_ranges_cover_exactly_their_numbers() -> None:
    for low, high in ((0, 5), (8, 36), (39, 1023), (53, 0xFFFF_FFFF), (0, 0xFFFF_FFFF), (7, 7)):
        blocks = [list(block) for block in int_in(1, low, high)]
        for value in {0, 1, 5, 6, 7, 8, 36, 37, 38, 39, 52, 53, 1023, 1024, 2**31, 0xFFFF_FFFF} | {low, high}:
            for register in (value, UPPER | value):
                assert any(_matches(block, {1: register}) for block in blocks) is (low <= value <= high), (low, value)
    assert [list(alternative) for alternative in int_is_not(0, 22)] and all(
        any(_matches(list(alternative), {0: register}) for alternative in int_is_not(0, 22)) is (register % UPPER != 22)
        for register in (0, 21, 22, 23, UPPER | 22, UPPER | 21, 0xFFFF_FFFF)
    )
