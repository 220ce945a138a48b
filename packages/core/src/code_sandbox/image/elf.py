"""Just enough ELF reading to put a dynamically linked runtime into a ``FROM scratch`` image.

It reads the machine, the program interpreter and the ``DT_NEEDED`` entries of 64-bit little-endian ELF files,
and resolves those names against the build host's library directories.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from code_sandbox.errors import ErrorCode, SandboxError

_MACHINES = {62: "x86_64", 183: "aarch64"}
_MULTIARCH = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}
_PT_LOAD, _PT_DYNAMIC, _PT_INTERP = 1, 2, 3
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


@dataclass(frozen=True)
class ElfInfo:
    """What the image build needs to know about one ELF file."""

    machine: str
    interpreter: str | None
    needed: tuple[str, ...]


def _not_linux_executable() -> SandboxError:
    return SandboxError(
        ErrorCode.IMAGE_BUILD_FAILED,
        "the runtime binary is not a 64-bit little-endian Linux ELF file",
        hint="pass --runtime with a Linux binary for the Docker daemon's architecture",
    )


def read_elf(path: Path) -> ElfInfo:
    """Read ``path``'s machine, interpreter and needed libraries.

    :raises SandboxError: ``IMAGE_BUILD_FAILED`` when it is not a 64-bit little-endian ELF for a known machine.
    """
    try:
        data = path.read_bytes()
    except OSError:
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the runtime binary cannot be read") from None
    try:
        return _parse(data)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        raise _not_linux_executable() from None


def _parse(data: bytes) -> ElfInfo:
    # e_ident: magic, class 2 (64-bit), data 1 (little-endian); e_ident[7] is the OS ABI (0 SysV or 3 Linux).
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1 or data[7] not in (0, 3):
        raise _not_linux_executable()
    e_machine = struct.unpack_from("<H", data, 18)[0]
    if e_machine not in _MACHINES:
        raise _not_linux_executable()
    loads: list[tuple[int, int, int]] = []
    interpreter: str | None = None
    dynamic: tuple[int, int] | None = None
    for p_type, p_offset, p_vaddr, p_filesz in _program_headers(data):
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_INTERP:
            interpreter = data[p_offset : p_offset + p_filesz].split(b"\x00", 1)[0].decode()
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    needed_offsets: list[int] = []
    strtab_vaddr: int | None = None
    if dynamic is not None:
        offset, size = dynamic
        for entry in range(offset, offset + size, 16):
            tag, value = struct.unpack_from("<qQ", data, entry)
            if tag == _DT_NULL:
                break
            if tag == _DT_NEEDED:
                needed_offsets.append(value)
            elif tag == _DT_STRTAB:
                strtab_vaddr = value
    needed: list[str] = []
    if needed_offsets:
        if strtab_vaddr is None:
            raise ValueError("DT_NEEDED without DT_STRTAB")
        strtab = _vaddr_to_offset(strtab_vaddr, loads)
        for name_offset in needed_offsets:
            start = strtab + name_offset
            needed.append(data[start : data.index(b"\x00", start)].decode())
    return ElfInfo(machine=_MACHINES[e_machine], interpreter=interpreter, needed=tuple(needed))


def _program_headers(data: bytes) -> Iterator[tuple[int, int, int, int]]:
    """Each program header of a 64-bit little-endian ELF file: its type, file offset, virtual address and file size."""
    e_phoff = struct.unpack_from("<Q", data, 32)[0]
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    for index in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, e_phoff + index * e_phentsize
        )
        yield p_type, p_offset, p_vaddr, p_filesz


def with_interpreter(data: bytes, interpreter: str) -> bytes:
    """``data``, an ELF executable, naming ``interpreter`` as its program interpreter instead of its own.

    The new path takes the old one's place in the file: it is padded to the same length with leading slashes (which
    path resolution ignores), so no offset in the file moves, and the kernel and gVisor both read it as one path.

    :raises ValueError: ``data`` has no interpreter, or ``interpreter`` is longer than the one it has.
    """
    for p_type, p_offset, _vaddr, p_filesz in _program_headers(data):
        if p_type != _PT_INTERP:
            continue
        encoded = interpreter.encode()
        if not encoded.startswith(b"/") or len(encoded) > p_filesz - 1:
            raise ValueError("the new interpreter path does not fit in the old one's place")
        field = encoded.rjust(p_filesz - 1, b"/") + b"\x00"
        return data[:p_offset] + field + data[p_offset + p_filesz :]
    raise ValueError("no program interpreter")


def _vaddr_to_offset(vaddr: int, loads: list[tuple[int, int, int]]) -> int:
    for seg_vaddr, seg_offset, seg_size in loads:
        if seg_vaddr <= vaddr < seg_vaddr + seg_size:
            return vaddr - seg_vaddr + seg_offset
    raise ValueError("address outside every loaded segment")


def library_dirs(machine: str) -> list[Path]:
    """The build host's library directories, most specific first."""
    triplet = _MULTIARCH[machine]
    names = [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    return [Path(name) for name in names]


def is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def resolve_runtime_files(binary: Path, modules: Iterable[Path] = ()) -> tuple[ElfInfo, dict[str, Path]]:
    """Find every file ``binary`` needs to start, and that the ELF ``modules`` it may load (a runtime's native
    extensions) need: the interpreter and the libraries, transitively.

    :return: the binary's ELF facts, and in-image path -> host file for each dependency. Libraries keep the
        directory they were found in on the host, which is where that host's dynamic loader looks for them.
    :raises SandboxError: ``IMAGE_BUILD_FAILED`` when a library cannot be found on this host.
    """
    info = read_elf(binary)
    files: dict[str, Path] = {}
    if info.interpreter:
        interpreter = Path(info.interpreter)
        if not interpreter.is_file():
            raise SandboxError(
                ErrorCode.IMAGE_BUILD_FAILED,
                "the runtime's dynamic loader is missing on this host",
                hint="build on a Linux host of the same architecture as the Docker daemon",
            )
        files[info.interpreter] = interpreter.resolve()
    pending = list(info.needed)
    for module in modules:
        extension = read_elf(module)
        if extension.machine != info.machine:
            raise _not_linux_executable()
        pending.extend(extension.needed)
    seen: set[str] = set()
    dirs = library_dirs(info.machine)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        found = next((d / name for d in dirs if (d / name).is_file()), None)
        if found is None:
            raise SandboxError(
                ErrorCode.IMAGE_BUILD_FAILED,
                f"the runtime needs the shared library {name}, which this host does not have",
                hint="install the library on the build host, or pass --runtime with a statically linked binary",
            )
        files.setdefault(str(found), found.resolve())
        dependency = read_elf(found.resolve())
        if dependency.machine != info.machine:
            raise _not_linux_executable()
        pending.extend(dependency.needed)
    return info, files
