"""Unpacking a package's tarball in memory, every entry checked before its bytes are kept: a bounded gzip stream,
small tar headers, regular files and directories at safe relative paths only, no native code, no install script,
and a ``package.json`` that matches the lockfile. Nothing from a package ever runs, and nothing is written.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from pathlib import PurePosixPath

from code_sandbox.jsonvalue import parse_json

from code_sandbox_javascript.lockfile import LockedPackage, printable, refuse

PACKAGE_MAX_BYTES = 128 * 1024 * 1024
"""A package's unpacked files together."""
ARCHIVE_MAX_BYTES = 2 * PACKAGE_MAX_BYTES
"""A package's tar archive once decompressed: its files and every header (a long header is data too)."""
PATH_MAX_BYTES = 1024
NAME_MAX_BYTES = 255
SET_MAX_FILES = 100_000
"""A package set's files, and so the entries of any one tarball."""
INSTALL_SCRIPTS = ("preinstall", "install", "postinstall")
"""The lifecycle scripts npm runs when it installs a registry package (``prepare`` runs only for git sources)."""

EXTENDED_HEADER_MAX_BYTES = 8 * 1024
"""A PAX extended header (``x``) or GNU long name (``L``, ``K``): real ones hold a path and a few numbers."""


def unpack(label: str, tarball: bytes) -> dict[str, bytes]:
    """The package's files, relative to its root (npm drops each entry's first path component), after every entry
    was checked; a directory entry only adds its path."""
    files: dict[str, bytes] = {}
    total = 0
    archive_bytes = _gunzip(label, tarball)
    _check_headers(label, archive_bytes)
    try:
        with tarfile.open(fileobj=io.BytesIO(archive_bytes), mode="r:") as archive:
            for count, member in enumerate(archive):
                if count >= SET_MAX_FILES:
                    refuse(label, f"has more than {SET_MAX_FILES} entries in its tarball")
                path = _member_path(label, member)
                if member.isdir():
                    continue
                if member.issym() or member.islnk():
                    refuse(label, f"has a link in its tarball ({printable(member.name)})")
                if not member.isreg():
                    refuse(label, f"has a device or other special file in its tarball ({printable(member.name)})")
                if path is None:
                    refuse(label, f"has a file outside its package directory ({printable(member.name)})")
                total += member.size
                if total > PACKAGE_MAX_BYTES:
                    refuse(label, f"unpacks to more than {PACKAGE_MAX_BYTES // 2**20} MiB")
                if path in files:
                    refuse(label, f"has two entries for {printable(path)} in its tarball")
                extracted = archive.extractfile(member)
                data = extracted.read() if extracted is not None else b""
                if len(data) != member.size:
                    refuse(label, "has a truncated tarball")
                _check_file(label, path, data)
                files[path] = data
    except (tarfile.TarError, OSError, EOFError, RecursionError, ValueError):
        refuse(label, "has a tarball that is not a gzipped tar archive")
    for path in files:
        for parent in PurePosixPath(path).parents:
            if str(parent) in files:
                refuse(label, f"has a file that is also a directory in its tarball ({printable(str(parent))})")
    return files


def _gunzip(label: str, tarball: bytes) -> bytes:
    """The archive inside the gzip stream, decompressed in one bounded step: a gzip bomb, or a header the size of
    the archive, stops at :data:`ARCHIVE_MAX_BYTES` instead of filling memory."""
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only
    try:
        archive = decompressor.decompress(tarball, ARCHIVE_MAX_BYTES + 1)
    except zlib.error:
        refuse(label, "has a tarball that is not gzip-compressed")
    if len(archive) > ARCHIVE_MAX_BYTES or decompressor.unconsumed_tail:
        refuse(label, f"has a tarball that unpacks to more than {ARCHIVE_MAX_BYTES // 2**20} MiB")
    if not decompressor.eof or decompressor.unused_data:
        refuse(label, "has a tarball that is cut short or has data after its end")
    return archive


def _check_headers(label: str, archive: bytes) -> None:
    """Walk the archive's 512-byte headers before :mod:`tarfile` parses any: extended headers must be small and
    never follow one another, and global ones are refused, so that no header can make parsing slow or deep."""
    offset, extended = 0, False
    while offset + 512 <= len(archive):
        header = archive[offset : offset + 512]
        if header == bytes(512):
            return  # the end-of-archive marker
        kind = header[156:157]
        size = _header_size(label, header[124:136])
        if kind in (b"g",):
            refuse(label, "has a global extended header in its tarball")
        if kind in (b"x", b"L", b"K"):
            if extended or size > EXTENDED_HEADER_MAX_BYTES:
                refuse(label, "has an oversized or repeated extended header in its tarball")
            extended = True
        else:
            extended = False
        offset += 512 + (size + 511) // 512 * 512


def _header_size(label: str, field: bytes) -> int:
    """A header's size field: octal digits, or base-256 when its first byte has the high bit set."""
    if field[:1] and field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    if digits and not digits.isdigit():
        refuse(label, "has a malformed header in its tarball")
    try:
        return int(digits or b"0", 8)
    except ValueError:
        refuse(label, "has a malformed header in its tarball")


def _member_path(label: str, member: tarfile.TarInfo) -> str | None:
    """The entry's path without its first component; refuses absolute paths, ``..``, odd characters."""
    name = member.name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        refuse(label, "has a path that is not UTF-8 in its tarball")
    if any(ord(char) < 0x20 or ord(char) == 0x7F or char == "\\" for char in name):
        refuse(label, f"has a path with a control character or backslash ({printable(name)})")
    parts = name.split("/")
    if len(name.encode()) > PATH_MAX_BYTES or any(len(part.encode()) > NAME_MAX_BYTES for part in parts):
        refuse(label, f"has a path longer than {PATH_MAX_BYTES} bytes, or a name longer than {NAME_MAX_BYTES}")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        refuse(label, f"has an unsafe path in its tarball ({printable(name)}): absolute, empty, '.' or '..'")
    if "node_modules" in parts[1:]:
        refuse(label, "carries packages of its own (node_modules in its tarball); vendor them from the lockfile")
    return "/".join(parts[1:]) or None


def _check_file(label: str, path: str, data: bytes) -> None:
    name = PurePosixPath(path).name
    if name == "binding.gyp":
        refuse(label, f"needs building (it has {printable(path)})")
    if name.endswith(".node") or data.startswith(b"\x7fELF"):
        refuse(label, f"carries native code ({printable(path)}); only pure JavaScript packages are vendored")


def check_manifest(package: LockedPackage, manifest: bytes | None) -> None:
    label = package.label
    if manifest is None:
        refuse(label, "has no package.json in its tarball")
    try:
        fields = parse_json(manifest)
    except (ValueError, RecursionError):
        refuse(label, "has a package.json that is not JSON")
    if not isinstance(fields, dict):
        refuse(label, "has a package.json that is not an object")
    if fields.get("name") not in (package.install_name, package.entry.name) or fields.get("version") != package.version:
        refuse(label, "has a package.json whose name or version differs from the lockfile's")
    scripts = fields.get("scripts")
    if isinstance(scripts, dict) and any(scripts.get(name) for name in INSTALL_SCRIPTS):
        refuse(label, "has an install script (preinstall, install or postinstall); none is ever run")
    if fields.get("gypfile") is True:
        refuse(label, "needs building (gypfile)")
