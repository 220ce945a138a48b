"""What the seccomp profile is made of: a named group of system calls with one decision, the reason for it, and
the argument conditions of its rule, in the shape Docker's JSON takes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NotRequired, TypedDict


class ArgCondition(TypedDict):
    """One condition on a system call's argument: ``op`` compares argument ``index`` with ``value`` (the argument
    masked with ``value`` is compared with ``valueTwo`` for ``SCMP_CMP_MASKED_EQ``)."""

    index: int
    value: int
    op: str
    valueTwo: NotRequired[int]


@dataclass(frozen=True)
class Group:
    """A set of system calls with one decision and the reason for it."""

    name: str
    why: str
    names: tuple[str, ...]
    action: str = "SCMP_ACT_ALLOW"
    errno_ret: int | None = None
    args: tuple[ArgCondition, ...] = ()
    """Conditions that must all hold for the decision to apply; none: it applies whatever the arguments."""


def syscall_names(text: str) -> tuple[str, ...]:
    """The system call names of ``text``, separated by whitespace."""
    return tuple(text.split())
