"""Native code in a sandbox, for tests that must not depend on what a language lets a program do: a static x86_64
program, written here byte by byte, that makes whatever system calls its stdin asks for.

The seccomp profile is the wall between a sandbox and the host kernel. A runtime without a system-call API hides that
wall's holes until something gives user code native code (a readable runtime copy, a writable ``/proc/<pid>/mem``, a
package with a native addon); this program asks the kernel directly, so a test sees the profile as native code does.

Protocol: each request is seven little-endian 64-bit words on stdin (the call's number and its six arguments); the
answer is the call's raw return value, one 64-bit word on stdout (``-errno`` on failure). The program exits when
stdin ends. Its data (paths, buffers) is a blob the test chooses, loaded at :data:`DATA_ADDRESS`, and it has
:data:`SCRATCH_BYTES` of zeroed memory after it at :func:`scratch_address`.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from code_sandbox.docker_engine import DockerEngine
from code_sandbox.engine import ExecRequest
from code_sandbox.hardening import SANDBOX_UIDS, ContainerRequest, user_of
from code_sandbox.profile import Profile

from tests.support.own_tag import variant_of
from tests.support.run import worker_tag

LOAD_ADDRESS = 0x40_0000
_HEADERS = 64 + 56  # the ELF header and one program header
_CODE_BYTES = 160  # room for the code below; the data blob starts after it
DATA_ADDRESS = LOAD_ADDRESS + _HEADERS + _CODE_BYTES
SCRATCH_BYTES = 1 << 20
_RECORD = 56


def scratch_address(data: bytes) -> int:
    """Where zeroed memory starts after a data blob (8-byte aligned; the request buffer comes first)."""
    return _buffer_address(data) + 64


def _buffer_address(data: bytes) -> int:
    return (DATA_ADDRESS + len(data) + 7) & ~7


def _code(buffer: int) -> bytes:
    """The loop: read a whole request (short reads allowed), make the call, write its return value."""
    out = bytearray()
    labels: dict[str, int] = {}
    fixups: list[tuple[int, int, str]] = []

    def emit(*chunks: bytes | str) -> None:
        for chunk in chunks:
            if isinstance(chunk, str):  # a jump target, rel8 or (with a "32:" prefix) rel32, resolved below
                size = 4 if chunk.startswith("32:") else 1
                fixups.append((len(out), size, chunk.removeprefix("32:")))
                out.extend(bytes(size))
            else:
                out.extend(chunk)

    def at(address: int) -> bytes:
        return struct.pack("<I", address)

    labels["next"] = len(out)
    emit(b"\x45\x31\xe4")  # xor r12d, r12d: bytes of the request read so far
    labels["fill"] = len(out)
    emit(b"\x31\xc0", b"\x31\xff")  # read(0, ...)
    emit(b"\x49\x8d\xb4\x24", at(buffer))  # lea rsi, [r12 + buffer]
    emit(b"\xba", struct.pack("<I", _RECORD), b"\x44\x29\xe2")  # mov edx, 56; sub edx, r12d
    emit(b"\x0f\x05", b"\x48\x85\xc0", b"\x7e", "exit")  # syscall; test rax, rax; jle exit
    emit(b"\x49\x01\xc4", b"\x49\x83\xfc", bytes([_RECORD]), b"\x72", "fill")  # add r12, rax; cmp r12, 56; jb fill
    for prefix, offset in (
        (b"\x48\x8b\x04\x25", 0),  # mov rax, [buffer]: the call's number
        (b"\x48\x8b\x3c\x25", 8),  # rdi
        (b"\x48\x8b\x34\x25", 16),  # rsi
        (b"\x48\x8b\x14\x25", 24),  # rdx
        (b"\x4c\x8b\x14\x25", 32),  # r10
        (b"\x4c\x8b\x04\x25", 40),  # r8
        (b"\x4c\x8b\x0c\x25", 48),  # r9
    ):
        emit(prefix, at(buffer + offset))
    emit(b"\x0f\x05", b"\x48\x89\x04\x25", at(buffer))  # syscall; mov [buffer], rax
    emit(b"\xb8\x01\x00\x00\x00", b"\xbf\x01\x00\x00\x00")  # write(1, buffer, 8)
    emit(b"\xbe", at(buffer), b"\xba\x08\x00\x00\x00", b"\x0f\x05")
    emit(b"\xe9", "32:next")  # jmp next
    labels["exit"] = len(out)
    emit(b"\xb8\x3c\x00\x00\x00", b"\x31\xff", b"\x0f\x05")  # exit(0)
    for position, size, label in fixups:
        distance = labels[label] - (position + size)
        out[position : position + size] = distance.to_bytes(size, "little", signed=True)
    assert len(out) <= _CODE_BYTES
    return bytes(out).ljust(_CODE_BYTES, b"\x90")


def program(data: bytes = b"") -> bytes:
    """The ELF executable, with ``data`` at :data:`DATA_ADDRESS`."""
    buffer = _buffer_address(data)
    body = _code(buffer) + data
    file_size = _HEADERS + len(body)
    memory_size = (scratch_address(data) - LOAD_ADDRESS) + SCRATCH_BYTES
    entry = LOAD_ADDRESS + _HEADERS
    header = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
    header += struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, entry, 64, 0, 0, 64, 56, 1, 0, 0, 0)  # ET_EXEC, x86_64
    segment = struct.pack("<IIQQQQQQ", 1, 7, 0, LOAD_ADDRESS, LOAD_ADDRESS, file_size, memory_size, 0x1000)  # RWX
    return header + segment + body


@dataclass(frozen=True)
class Call:
    """One system call: its x86_64 number and up to six arguments."""

    number: int
    arguments: Sequence[int] = ()

    def request(self) -> bytes:
        words = [self.number, *self.arguments, *[0] * (6 - len(self.arguments))]
        return struct.pack("<7Q", *(word & 0xFFFF_FFFF_FFFF_FFFF for word in words))


def requests(calls: Sequence[Call]) -> bytes:
    return b"".join(call.request() for call in calls)


def answers(stdout: bytes) -> list[int]:
    """Each call's return value, signed (a failed call gives ``-errno``)."""
    assert len(stdout) % 8 == 0, len(stdout)
    return list(struct.unpack(f"<{len(stdout) // 8}q", stdout))


class Blob:
    """A data blob built up of NUL-terminated strings and buffers, each at a known address."""

    def __init__(self) -> None:
        self._data = bytearray()

    def add(self, value: bytes, *, terminate: bool = True) -> int:
        address = DATA_ADDRESS + len(self._data)
        self._data.extend(value + (b"\0" if terminate else b""))
        while len(self._data) % 8:
            self._data.append(0)
        return address

    @property
    def data(self) -> bytes:
        return bytes(self._data)


PROBER_PATH = "/opt/native/prober"
"""Where a test image derived from the sandbox image holds :func:`program` (readable and executable: a test's tool)."""


@dataclass(frozen=True)
class NativeSandbox:
    """A container made exactly as a sandbox is (the hardening, the seccomp profile, the runtime under test) from the
    sandbox image plus the prober, and the sandbox uid that owns its tmpfs mounts."""

    engine: DockerEngine
    container_id: str
    uid: int

    def calls(self, calls: Sequence[Call], *, timeout: float = 60) -> list[int]:
        """Make ``calls`` in one prober process of the sandbox uid; each one's return value."""
        result = self.engine.exec(
            self.container_id,
            ExecRequest([PROBER_PATH], user=user_of(self.uid), timeout=timeout, max_stdout=8 * len(calls) + 8,
                        stdin=[requests(calls)]),
        )  # fmt: skip
        assert result.exit_code == 0, result.stderr
        values = answers(result.stdout)
        assert len(values) == len(calls), values
        return values


@contextmanager
def native_sandbox(engine: DockerEngine, profile: Profile, image_id: str, data: bytes) -> Generator[NativeSandbox]:
    """A :class:`NativeSandbox` whose prober carries ``data``; the container and the image go at the end."""
    with variant_of(engine, profile, image_id, f"code-sandbox-test-native:{worker_tag()}") as variant:
        variant.build(f"COPY prober {PROBER_PATH}", {"prober": program(data)}, mode=0o755)
        facts = engine.image_facts(variant.profile.image_spec().tag)
        assert facts is not None
        uid = random.choice(SANDBOX_UIDS)  # noqa: S311 - a test's pick, not a secret
        watchdog = [*profile.helper_argv("watchdog"), "600"]
        if engine.runtime_in_force().user_space_kernel:
            raise AssertionError("the seccomp profile is runc's: gVisor does not apply it")
        request = ContainerRequest(facts.id, watchdog, {}, engine.daemon_facts().apparmor, uid=uid)
        container_id = engine.create_container(request)
        try:
            yield NativeSandbox(engine, container_id, uid)
        finally:
            engine.remove_container(container_id)
