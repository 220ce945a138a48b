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
    alternatives: tuple[tuple[ArgCondition, ...], ...] = ()
    """Instead of :attr:`args`: sets of conditions of which one must hold (a rule each)."""

    def condition_sets(self) -> tuple[tuple[ArgCondition, ...], ...]:
        """The conditions of each rule this group makes: one set per rule."""
        return self.alternatives or (self.args,)


LOW_32_BITS = 0xFFFF_FFFF
"""The filter sees a system call's arguments as 64-bit registers, but the kernel reads an ``int`` argument from the low
32 bits alone: a comparison of the whole register (``!=``, ``<=``, ``>=``) is decided on bits the kernel ignores, so a
program that sets them makes ``PR_SET_SECCOMP`` pass as "not 22". Conditions on an ``int`` argument therefore look at
the low 32 bits only (a masked comparison) or compare the whole register for equality (set upper bits then fail)."""


def int_is(index: int, value: int) -> ArgCondition:
    """The ``int`` argument ``index`` is ``value`` (its low 32 bits; the upper ones are the kernel's to ignore)."""
    return {"index": index, "value": LOW_32_BITS, "valueTwo": value & LOW_32_BITS, "op": "SCMP_CMP_MASKED_EQ"}


def int_is_not(index: int, value: int) -> tuple[tuple[ArgCondition, ...], ...]:
    """The ``int`` argument ``index`` is not ``value``: one alternative per low bit, "this bit differs from
    ``value``'s"."""
    return tuple(
        ({"index": index, "value": 1 << bit, "valueTwo": (~value) & (1 << bit), "op": "SCMP_CMP_MASKED_EQ"},)
        for bit in range(32)
    )


def int_in(index: int, low: int, high: int) -> tuple[tuple[ArgCondition, ...], ...]:
    """The ``int`` argument ``index`` lies in ``low..high`` (read as an unsigned 32-bit number): one alternative per
    aligned block of the range, each a masked comparison of the low 32 bits."""
    if not 0 <= low <= high <= LOW_32_BITS:
        raise ValueError(f"not a range of 32-bit numbers: {low}..{high}")
    blocks: list[tuple[ArgCondition, ...]] = []
    start = low
    while start <= high:
        size = 1
        while start % (size * 2) == 0 and start + size * 2 - 1 <= high and size < 1 << 32:
            size *= 2
        blocks.append(({"index": index, "value": LOW_32_BITS & ~(size - 1), "valueTwo": start,
                        "op": "SCMP_CMP_MASKED_EQ"},))  # fmt: skip
        start += size
    return tuple(blocks)


def syscall_names(text: str) -> tuple[str, ...]:
    """The system call names of ``text``, separated by whitespace."""
    return tuple(text.split())
