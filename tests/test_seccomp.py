"""Our seccomp profile, read as data: what it allows, with which arguments, and what it refuses. That the engine
applies it is shown by the hardening snapshot (tests/test_sessions.py) and the attacks in tests/security."""

from __future__ import annotations

import errno
import json
from typing import Any

import pytest
from code_sandbox.seccomp import AF_UNIX, CLONE_NAMESPACE_FLAGS, build_profile, check_consistency, profile_text

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


def _rules(architecture: str) -> list[dict[str, Any]]:
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
        assert rules[0]["args"] == [{"index": 0, "value": AF_UNIX, "op": "SCMP_CMP_EQ"}]


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
    assert rule["args"] == [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]


def test_an_architecture_without_a_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="no seccomp profile"):
        build_profile("riscv64")
