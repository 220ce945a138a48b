"""The seal: a 64-bit ELF shared object whose only code makes the process that loads it non-dumpable.

A helper that shares its uid with user code (the runner, the file helper) must be out of that code's reach: no
``/proc/<pid>/fd``, ``mem`` or ``environ``, no ptrace. Linux and gVisor both grant those to a same-uid process only
while the target is dumpable. Every helper loads this library first thing (``process.dlopen``, or an extension
import), and its initialiser calls ``prctl(PR_SET_DUMPABLE, 0)``; the helper then checks that it is sealed (its
``/proc/self/fd`` is root's) and refuses to run otherwise.

The object is written here byte by byte, from the few instructions below, rather than compiled: an image build needs
no compiler, and the bytes are the same on every build host, so ``verify-image`` compares them exactly. It has one
loadable segment for code, one for its dynamic section, an empty symbol table and hash table, ``DT_INIT`` pointing at
the code, and a non-executable stack. It defines no symbols, so a runtime that looks for a module entry point after
loading it reports an error, which the helper ignores: the initialiser has run by then.
"""

from __future__ import annotations

import struct

SEAL_PATH = "/usr/local/lib/code-sandbox/seal.so"
"""Where every image built by ``build-image --offline`` holds the seal (root-owned, mode 0555)."""

_PR_SET_DUMPABLE = 4

# prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); return. Nothing else: no stack use, no other register touched that the
# caller expects kept (the system call clobbers only registers the ABI lets a callee clobber).
_CODE = {
    # mov edi, 4; xor esi, esi; xor edx, edx; xor r10d, r10d; xor r8d, r8d; mov eax, 157 (prctl); syscall; ret
    "x86_64": (
        62,
        bytes.fromhex("bf") + struct.pack("<I", _PR_SET_DUMPABLE) + bytes.fromhex("31f6 31d2 4531d2 4531c0")
        + bytes.fromhex("b8") + struct.pack("<I", 157) + bytes.fromhex("0f05 c3"),
    ),
    # mov x0, #4; mov x1, #0; mov x2, #0; mov x3, #0; mov x4, #0; mov x8, #167 (prctl); svc #0; ret
    "aarch64": (
        183,
        struct.pack(
            "<8I",
            0xD2800000 | _PR_SET_DUMPABLE << 5,
            0xD2800001,
            0xD2800002,
            0xD2800003,
            0xD2800004,
            0xD2800008 | 167 << 5,
            0xD4000001,
            0xD65F03C0,
        ),
    ),
}  # fmt: skip

_PAGE = 0x10000  # a segment alignment every supported kernel page size divides (4, 16 and 64 KiB)
_EHDR, _PHDR, _DYN, _SYM = 64, 56, 16, 24
_PT_LOAD, _PT_DYNAMIC, _PT_GNU_STACK = 1, 2, 0x6474E551
_PF_X, _PF_W, _PF_R = 1, 2, 4
_DT_NULL, _DT_HASH, _DT_STRTAB, _DT_SYMTAB, _DT_STRSZ, _DT_SYMENT, _DT_INIT = 0, 4, 5, 6, 10, 11, 12


def seal_architectures() -> tuple[str, ...]:
    """The machine names (as ``uname -m`` gives them) the seal is written for."""
    return tuple(_CODE)


def seal_library(architecture: str) -> bytes | None:
    """The seal for ``architecture`` (``x86_64``, ``aarch64``); ``None`` for any other."""
    if architecture not in _CODE:
        return None
    machine, code = _CODE[architecture]
    headers = 4
    text = _EHDR + headers * _PHDR  # the code follows the headers in the first segment
    hash_table = _align(text + len(code), 8)
    symbols = hash_table + 16  # nbucket = nchain = 1, bucket and chain empty
    strings = symbols + _SYM  # the null symbol only
    first_end = strings + 1  # the string table is one NUL byte
    dynamic_offset = _align(first_end, 8)
    dynamic_address = dynamic_offset + _PAGE  # its own writable segment: the loader may relocate entries in place
    entries = [
        (_DT_HASH, hash_table), (_DT_STRTAB, strings), (_DT_SYMTAB, symbols), (_DT_STRSZ, 1),
        (_DT_SYMENT, _SYM), (_DT_INIT, text), (_DT_NULL, 0),
    ]  # fmt: skip
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries)
    size = dynamic_offset + len(dynamic)
    elf_header = struct.pack(
        "<4sBBBBB7xHHIQQQIHHHHHH",
        b"\x7fELF", 2, 1, 1, 0, 0,  # 64-bit, little-endian, version 1, System V ABI
        3, machine, 1,  # ET_DYN
        0, _EHDR, 0,  # no entry point, program headers right after this header, no section headers
        0, _EHDR, _PHDR, headers, 64, 0, 0,
    )  # fmt: skip
    program_headers = b"".join([
        _program_header(_PT_LOAD, _PF_R | _PF_X, 0, 0, first_end, _PAGE),
        _program_header(_PT_LOAD, _PF_R | _PF_W, dynamic_offset, dynamic_address, len(dynamic), _PAGE),
        _program_header(_PT_DYNAMIC, _PF_R | _PF_W, dynamic_offset, dynamic_address, len(dynamic), 8),
        _program_header(_PT_GNU_STACK, _PF_R | _PF_W, 0, 0, 0, 16),
    ])  # fmt: skip
    image = bytearray(size)
    image[0:_EHDR] = elf_header
    image[_EHDR:text] = program_headers
    image[text : text + len(code)] = code
    image[hash_table : hash_table + 16] = struct.pack("<4I", 1, 1, 0, 0)
    image[dynamic_offset:size] = dynamic
    return bytes(image)


def _program_header(kind: int, flags: int, offset: int, address: int, size: int, align: int) -> bytes:
    return struct.pack("<IIQQQQQQ", kind, flags, offset, address, address, size, size, align)


def _align(value: int, boundary: int) -> int:
    return -(-value // boundary) * boundary
