"""Our seccomp profile, read as data: what it allows, with which arguments, and what it refuses. That the engine
applies it is shown by the hardening snapshot (tests/test_sessions.py) and the attacks in tests/security."""

from __future__ import annotations

import errno
import json
import operator
from collections.abc import Callable

import pytest
from code_sandbox.seccomp import (
    AF_UNIX,
    CLONE_NAMESPACE_FLAGS,
    ArgCondition,
    SyscallRule,
    build_profile,
    check_consistency,
    profile_text,
)

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
        assert not any(_matches(rule, {1: 1, 2: option}) for rule in rules), option
    for option in (7, 8, 16, 20, 21, 53, 60):  # SO_SNDBUF, SO_RCVBUF, SO_PASSCRED, the timeouts, newer ones
        assert any(_matches(rule, {1: 1, 2: option}) for rule in rules), option


def test_no_filter_of_its_own_and_no_page_cache_probe() -> None:
    assert _allowing("seccomp") == []  # not allowed at all
    assert not any(_matches(rule, {0: 22}) for rule in _allowing("prctl"))  # PR_SET_SECCOMP
    assert any(_matches(rule, {0: 4}) for rule in _allowing("prctl"))  # PR_SET_DUMPABLE: the helpers' seal
    for name in ("preadv2", "pwritev2"):
        assert [_matches(rule, {5: 8}) for rule in _allowing(name)] == [False]  # RWF_NOWAIT
        assert [_matches(rule, {5: 0}) for rule in _allowing(name)] == [True]
    assert [_matches(rule, {3: 4}) for rule in _allowing("fadvise64")] == [False]  # POSIX_FADV_DONTNEED


def _matches(conditions: list[ArgCondition], arguments: dict[int, int]) -> bool:
    """Whether a call with ``arguments`` (index -> value) meets every condition of one rule."""
    tests: dict[str, Callable[[int, int], bool]] = {
        "SCMP_CMP_EQ": operator.eq,
        "SCMP_CMP_NE": operator.ne,
        "SCMP_CMP_LE": operator.le,
        "SCMP_CMP_GE": operator.ge,
    }
    return all(tests[condition["op"]](arguments[condition["index"]], condition["value"]) for condition in conditions)
