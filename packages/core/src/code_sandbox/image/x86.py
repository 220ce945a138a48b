"""Just enough of an x86_64 assembler to write a small static program byte by byte (:mod:`code_sandbox.image.jail`):
64-bit registers, ``[base + disp32]`` operands, rel32 jumps and calls, and Linux system calls by name."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping

RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI, R8, R9, R10, R11, R12, R13, R14, R15 = range(16)


class X86:
    """Just enough of an x86_64 assembler for the jail: 64-bit registers, [base + disp32] operands, rel32 jumps."""

    def __init__(self, syscalls: Mapping[str, int]) -> None:
        self.syscalls = syscalls
        self.code = bytearray()
        self.labels: dict[str, int] = {}
        self.fixups: list[tuple[int, str]] = []

    def label(self, name: str) -> None:
        if name in self.labels:
            raise ValueError(name)
        self.labels[name] = len(self.code)

    def _rex(self, reg: int, rm: int, *, wide: bool = True) -> bytes:
        rex = 0x40 | (8 if wide else 0) | (4 if reg & 8 else 0) | (1 if rm & 8 else 0)
        return bytes([rex]) if rex != 0x40 else b""

    def _mem(self, reg: int, base: int, disp: int) -> bytes:
        modrm = bytes([0x80 | (reg & 7) << 3 | (base & 7)])
        sib = b"\x24" if base & 7 == RSP else b""
        return modrm + sib + struct.pack("<i", disp)

    def _reg(self, reg: int, rm: int) -> bytes:
        return bytes([0xC0 | (reg & 7) << 3 | (rm & 7)])

    def emit(self, *chunks: bytes) -> None:
        for chunk in chunks:
            self.code.extend(chunk)

    def mov_imm(self, reg: int, value: int) -> None:
        """``mov r64, imm32`` (sign-extended)."""
        self.emit(self._rex(0, reg), b"\xc7", self._reg(0, reg), struct.pack("<i", value))

    def mov(self, dst: int, src: int) -> None:
        self.emit(self._rex(src, dst), b"\x89", self._reg(src, dst))

    def load(self, dst: int, base: int, disp: int = 0, *, wide: bool = True) -> None:
        self.emit(self._rex(dst, base, wide=wide), b"\x8b", self._mem(dst, base, disp))

    def store(self, base: int, disp: int, src: int) -> None:
        """``mov [base + disp], r64``."""
        self.emit(self._rex(src, base), b"\x89", self._mem(src, base, disp))

    def load_byte(self, dst: int, base: int, disp: int = 0) -> None:
        """``movzx r32, byte [base + disp]``."""
        self.emit(self._rex(dst, base, wide=False), b"\x0f\xb6", self._mem(dst, base, disp))

    def lea(self, dst: int, base: int, disp: int) -> None:
        self.emit(self._rex(dst, base), b"\x8d", self._mem(dst, base, disp))

    def add(self, dst: int, src: int) -> None:
        self.emit(self._rex(src, dst), b"\x01", self._reg(src, dst))

    def _group1(self, extension: int, reg: int, value: int) -> None:
        self.emit(self._rex(0, reg), b"\x81", self._reg(extension, reg), struct.pack("<i", value))

    def add_imm(self, reg: int, value: int) -> None:
        self._group1(0, reg, value)

    def and_imm(self, reg: int, value: int) -> None:
        self._group1(4, reg, value)

    def sub_imm(self, reg: int, value: int) -> None:
        self._group1(5, reg, value)

    def cmp_imm(self, reg: int, value: int) -> None:
        self._group1(7, reg, value)

    def cmp(self, left: int, right: int) -> None:
        self.emit(self._rex(right, left), b"\x39", self._reg(right, left))

    def test(self, reg: int) -> None:
        self.emit(self._rex(reg, reg), b"\x85", self._reg(reg, reg))

    def imul_imm(self, dst: int, src: int, value: int) -> None:
        self.emit(self._rex(dst, src), b"\x6b", self._reg(dst, src), struct.pack("<b", value))

    def shr_imm(self, reg: int, value: int) -> None:
        self.emit(self._rex(0, reg), b"\xc1", self._reg(5, reg), bytes([value]))

    def _jump(self, opcode: bytes, target: str) -> None:
        self.emit(opcode)
        self.fixups.append((len(self.code), target))
        self.emit(bytes(4))

    def jmp(self, target: str) -> None:
        self._jump(b"\xe9", target)

    def call(self, target: str) -> None:
        self._jump(b"\xe8", target)

    def jcc(self, condition: str, target: str) -> None:
        codes = {"e": 0x84, "ne": 0x85, "a": 0x87, "ae": 0x83, "l": 0x8C, "g": 0x8F, "s": 0x88, "ns": 0x89, "b": 0x82}
        self._jump(bytes([0x0F, codes[condition]]), target)

    def ret(self) -> None:
        self.emit(b"\xc3")

    def syscall(self, name: str, *arguments: int | Callable[[], None]) -> None:
        """Sets ``eax`` to the call's number and each argument register (an ``int`` is an immediate, a callable
        emits its own load), then makes the call. The result is in ``rax``; ``rcx`` and ``r11`` are clobbered."""
        for register, argument in zip((RDI, RSI, RDX, R10, R8, R9), arguments, strict=False):
            if callable(argument):
                argument()
            else:
                self.mov_imm(register, argument)
        self.kernel(name)

    def kernel(self, name: str) -> None:
        """Makes the call ``name`` with the argument registers as they stand: ``eax`` set, then ``syscall``."""
        self.mov_imm(RAX, self.syscalls[name])
        self.emit(b"\x0f\x05")

    def resolve(self) -> bytes:
        for position, target in self.fixups:
            distance = self.labels[target] - (position + 4)
            self.code[position : position + 4] = struct.pack("<i", distance)
        return bytes(self.code)
