"""Vendoring an npm ``package-lock.json`` into a package set, for ``build-image --packages``.

Every package the lockfile lists is checked before anything is fetched (a registry package with a sha512
integrity, no install script, not bundled, not a link), its tarball is checked against that integrity before it
is opened, and every entry of the tarball is checked before its bytes are kept: regular files and directories at
safe relative paths only, no native code, no install scripts. Everything happens in memory; nothing from a package
ever runs, and nothing is written to the host. A tarball comes from its entry's ``resolved`` URL, or, for an entry
without one (npm's ``omit-lockfile-registry-resolved``), from the registry npm is configured with (:mod:`.registry`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import re
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn, cast

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.profile import PackageSet
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from code_sandbox_javascript.registry import NpmConfig, Registry, load_npm_config

LOCKFILE_MAX_BYTES = 32 * 1024 * 1024
TARBALL_MAX_BYTES = 64 * 1024 * 1024
"""A package's compressed tarball."""
PACKAGE_MAX_BYTES = 128 * 1024 * 1024
"""A package's unpacked files together."""
ARCHIVE_MAX_BYTES = 2 * PACKAGE_MAX_BYTES
"""A package's tar archive once decompressed: its files and every header (a long header is data too)."""
PATH_MAX_BYTES = 1024
NAME_MAX_BYTES = 255
SET_MAX_BYTES = 512 * 1024 * 1024
SET_MAX_FILES = 100_000
INSTALL_SCRIPTS = ("preinstall", "install", "postinstall")
"""The lifecycle scripts npm runs when it installs a registry package (``prepare`` runs only for git sources)."""

Fetch = Callable[[str], bytes]
"""Downloads an http or https URL (a lockfile's https ``resolved``, or a tarball URL on npm's registry) and returns
the body."""

_NAME = r"(?!node_modules(?:/|$))(?!favicon\.ico(?:/|$))[A-Za-z0-9][A-Za-z0-9._~-]*"
_INSTALL_NAME = rf"(?:@{_NAME}/)?{_NAME}"
_INSTALL_NAME_ONLY = re.compile(_INSTALL_NAME)
_KEY = re.compile(rf"(?:node_modules/{_INSTALL_NAME}/)*node_modules/(?P<name>{_INSTALL_NAME})")
"""A lockfile key: where a package is installed, its parents' directories first; ``name`` is its own."""
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+-]*")
_NODE_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "armv7l": "arm", "i686": "ia32"}


class LockEntry(BaseModel):
    """The fields of a ``packages`` entry that decide whether and how it is vendored; the rest is ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)

    version: str | None = None
    resolved: str | None = None
    integrity: str | None = None
    name: str | None = None
    link: bool = False
    optional: bool = False
    has_install_script: bool = Field(default=False, alias="hasInstallScript")
    in_bundle: bool = Field(default=False, alias="inBundle")
    os: list[str] | None = None
    cpu: list[str] | None = None
    libc: list[str] | None = None


class _Package:
    """A lockfile entry that passed the checks that need no tarball."""

    def __init__(self, key: str, name: str, entry: LockEntry, version: str, digests: list[bytes]) -> None:
        self.key = key
        self.entry = entry
        self.version = version
        self.digests = digests
        self.install_name = name
        self.parent = key.removesuffix(f"/node_modules/{name}") if key != f"node_modules/{name}" else None
        """The key of the package it is nested under, or ``None`` at the top."""
        self.label = f"{self.install_name}@{version}"
        self.prefix = key.removeprefix("node_modules/")
        """Where its files go, relative to the package root."""

    @property
    def importable(self) -> bool:
        """Whether code in /workspace finds it by name: a top-level package, not one nested under another."""
        return "/node_modules/" not in self.key


def vendor_lockfile(
    lockfile: Path,
    *,
    sources: Path | None,
    progress: Callable[[str], None],
    forbidden_names: Iterable[str] = (),
    fetch: Fetch | None = None,
    environ: Mapping[str, str] | None = None,
) -> PackageSet:
    """Check and unpack every package ``lockfile`` lists.

    :param sources: a directory of tarballs (found by content, whatever their names) or an npm cache; when
        given, nothing is downloaded. Else each tarball comes from its entry's ``resolved`` https URL or, without
        one, from the registry npm would use for it (npm's config beside the lockfile, the user's, the global one).
    :param forbidden_names: package names refused outright (package managers).
    :param fetch: how a URL is downloaded (:func:`fetch_url` by default).
    :param environ: the environment npm's config is read from (``npm_config_*``, ``HOME``, ``PREFIX``, ``PATH``);
        :data:`os.environ` by default.
    """
    packages = [_checked_entry(key, entry, frozenset(forbidden_names)) for key, entry in _read_lockfile(lockfile)]
    here = ("linux", _NODE_ARCH.get(platform.machine().lower(), platform.machine().lower()), "glibc")
    kept: list[_Package] = []
    for package in packages:
        entry = package.entry
        if _allows(entry.os, here[0]) and _allows(entry.cpu, here[1]) and _allows(entry.libc, here[2]):
            kept.append(package)
        elif entry.optional:
            progress(f"skipping {package.label}: an optional package for another platform")
        else:
            _refuse(package.label, f"is for another platform (os {entry.os}, cpu {entry.cpu}, libc {entry.libc})")
    keys = {package.key for package in kept}
    for package in kept:
        if package.parent is not None and package.parent not in keys:
            _refuse(package.label, "is nested under a package that the lockfile does not list")
    if not any(package.importable for package in kept):
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the lockfile lists no packages to vendor")
    store = _Tarballs(sources) if sources is not None else None
    urls: dict[str, tuple[str, Registry | None]] = {}
    if store is None:
        urls = _tarball_urls(kept, lockfile.parent, os.environ if environ is None else environ, progress)
    progress(f"vendoring {len(kept)} packages" + (" from the given tarballs" if store else ""))
    files: dict[str, bytes] = {}
    total = 0
    for package in kept:
        if store is not None:
            tarball = store.get(package)
        else:
            tarball = _download(package, *urls[package.key], fetch or fetch_url)
        if not any(hashlib.sha512(tarball).digest() == digest for digest in package.digests):
            _refuse(package.label, "does not match the lockfile's integrity (sha512): the tarball was changed")
        unpacked = _unpack(package.label, tarball)
        _check_manifest(package, unpacked.get("package.json"))
        for path, data in unpacked.items():
            if files.setdefault(f"{package.prefix}/{path}", data) is not data:
                _refuse(package.label, f"has a file that another package has too ({_printable(path)})")
            total += len(data)
        if len(files) > SET_MAX_FILES or total > SET_MAX_BYTES:
            raise SandboxError(
                ErrorCode.IMAGE_BUILD_FAILED,
                f"the package set is larger than {SET_MAX_FILES} files or {SET_MAX_BYTES // 2**20} MiB",
            )
    listed = sorted(package.label for package in kept if package.importable)
    if len(set(listed)) != len(listed):
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the lockfile lists one top-level package twice")
    progress(f"vendored {len(kept)} packages: {len(files)} files, {total / 2**20:.1f} MiB")
    return PackageSet(packages=tuple(listed), files=files)


def _read_lockfile(lockfile: Path) -> list[tuple[str, LockEntry]]:
    def fail(reason: str) -> NoReturn:
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"the lockfile {reason}", hint=_LOCKFILE_HINT)

    try:
        with lockfile.open("rb") as stream:
            raw = stream.read(LOCKFILE_MAX_BYTES + 1)
    except OSError:
        fail("cannot be read")
    if len(raw) > LOCKFILE_MAX_BYTES:
        fail(f"is larger than {LOCKFILE_MAX_BYTES // 2**20} MiB")
    try:
        document = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        fail("is not JSON")
    if not isinstance(document, dict):
        fail("is not a package-lock.json")
    version = document.get("lockfileVersion")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if version not in (2, 3):  # True == 1: a boolean is refused too
        fail(f"has lockfileVersion {version!r}; 2 or 3 is needed (npm 7 or later writes them)")
    entries = document.get("packages")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if not isinstance(entries, dict):
        fail("has no packages section")
    checked: list[tuple[str, LockEntry]] = []
    for key, value in sorted(entries.items()):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        if key == "":
            continue  # the project itself
        try:
            checked.append((str(key), LockEntry.model_validate(value)))  # pyright: ignore[reportUnknownArgumentType]
        except ValidationError:
            fail(f"has a malformed entry at {_printable(str(key))}")  # pyright: ignore[reportUnknownArgumentType]
    return checked


_LOCKFILE_HINT = "make it with `npm install --package-lock-only` (see README, Offline package sets)"


def _no_constant(constant: str) -> NoReturn:
    raise ValueError(constant)


def _checked_entry(key: str, entry: LockEntry, forbidden: frozenset[str]) -> _Package:
    """Every check that needs no tarball, so that a lockfile that cannot build fails before any download."""
    matched = _KEY.fullmatch(key)
    if entry.link or matched is None:
        _refuse(_printable(key), "is a link, a workspace package or a name npm refuses, not a registry package")
    name = matched["name"]
    version = entry.version or ""
    label = f"{name}@{_printable(version)}"
    if _VERSION.fullmatch(version) is None:
        _refuse(label, "has no plain version (an alias, a git or file source, or a tag)")
    if entry.resolved is not None and not entry.resolved.startswith("https://"):
        _refuse(label, "does not come from a registry over https (git, file, link and http sources are refused)")
    if entry.in_bundle:
        _refuse(label, "is bundled inside another package; only packages from the registry are vendored")
    if entry.has_install_script:
        _refuse(label, "has an install script (it needs building or runs code at install); none is ever run")
    if {name, entry.name or ""} & forbidden:
        _refuse(label, "is a package manager, which the image must not carry")
    digests = _sha512_digests(entry.integrity or "")
    if not digests:
        _refuse(label, "has no sha512 integrity in the lockfile")
    return _Package(key, name, entry, version, digests)


def _sha512_digests(integrity: str) -> list[bytes]:
    """The sha512 digests of an SRI string (``sha512-<base64>[?options]``, several separated by whitespace)."""
    digests: list[bytes] = []
    for token in integrity.split():
        algorithm, _, value = token.partition("-")
        if algorithm != "sha512":
            continue
        try:
            digest = base64.b64decode(value.split("?", 1)[0], validate=True)
        except ValueError:
            continue
        if len(digest) == 64:
            digests.append(digest)
    return digests


def _allows(values: list[str] | None, current: str) -> bool:
    """npm's platform rule: ``!x`` excludes x; any positive entry means only those."""
    if not values:
        return True
    if f"!{current}" in values:
        return False
    positive = [value for value in values if not value.startswith("!")]
    return not positive or current in positive


class _Tarballs:
    """Tarballs found by their sha512 in a directory of ``.tgz`` files or in an npm cache (``_cacache``)."""

    def __init__(self, directory: Path) -> None:
        self.cache: Path | None = None
        for candidate in (directory / "_cacache", directory):
            if (candidate / "content-v2").is_dir():
                self.cache = candidate / "content-v2" / "sha512"
                break
        self.directory = directory
        self._index: dict[bytes, Path] | None = None

    def get(self, package: _Package) -> bytes:
        for digest in package.digests:
            path = self._find(digest)
            if path is not None:
                return _read_tarball(path, package.label)
        _refuse(package.label, "is not among the given tarballs (looked up by its sha512 integrity)")

    def _find(self, digest: bytes) -> Path | None:
        if self.cache is not None:
            hexed = digest.hex()
            path = self.cache / hexed[:2] / hexed[2:4] / hexed[4:]
            return path if path.is_file() else None
        if self._index is None:
            self._index = {}
            try:
                candidates = sorted(self.directory.iterdir())
            except OSError:
                candidates = []
            for path in candidates:
                if path.name.endswith((".tgz", ".tar.gz")) and path.is_file():
                    try:
                        with path.open("rb") as stream:
                            data = stream.read(TARBALL_MAX_BYTES + 1)
                    except OSError:
                        continue
                    if len(data) <= TARBALL_MAX_BYTES:
                        self._index[hashlib.sha512(data).digest()] = path
        return self._index.get(digest)


def _read_tarball(path: Path, label: str) -> bytes:
    try:
        with path.open("rb") as stream:
            data = stream.read(TARBALL_MAX_BYTES + 1)
    except OSError:
        _refuse(label, "has a tarball that cannot be read")
    if len(data) > TARBALL_MAX_BYTES:
        _refuse(label, f"has a tarball larger than {TARBALL_MAX_BYTES // 2**20} MiB")
    return data


def _tarball_urls(
    packages: list[_Package], project: Path, environ: Mapping[str, str], progress: Callable[[str], None]
) -> dict[str, tuple[str, Registry | None]]:
    """Each package's tarball URL, and the registry it was derived from when the lockfile records none; npm's
    config is read only when some entry needs it, and every URL is known before the first download."""
    config: NpmConfig | None = None
    urls: dict[str, tuple[str, Registry | None]] = {}
    counts: dict[Registry, int] = {}
    for package in packages:
        if package.entry.resolved is not None:
            urls[package.key] = (package.entry.resolved, None)
            continue
        name = package.entry.name if package.entry.name is not None else package.install_name
        if _INSTALL_NAME_ONLY.fullmatch(name) is None:
            _refuse(package.label, "is an alias of a name npm refuses")
        if config is None:
            config = load_npm_config(project, environ)
        registry = config.registry_for(name)
        urls[package.key] = (registry.tarball_url(name, package.version), registry)
        counts[registry] = counts.get(registry, 0) + 1
    for registry, count in counts.items():
        progress(
            f"{count} {'package' if count == 1 else 'packages'} without a resolved URL from "
            f"{_printable(registry.shown)} ({registry.source})"
            + (": plain http, each tarball still checked against its integrity" if registry.plain_http else "")
        )
    return urls


def _download(package: _Package, url: str, registry: Registry | None, fetch: Fetch) -> bytes:
    try:
        return fetch(url)
    except SandboxError as error:
        where = f" from the registry named by {registry.source}" if registry is not None else ""
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            f"package {package.label} could not be downloaded{where}: {error.message}",
            hint="pass --tarballs with a directory of the tarballs or an npm cache (README, Offline package sets)",
        ) from None


class _NoDowngrade(urllib.request.HTTPRedirectHandler):
    """Redirects stay on http or https, and never go from https down to http."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        https_only = str(req.full_url).startswith("https://")
        if not newurl.startswith("https://") and (https_only or not newurl.startswith("http://")):
            allowed = "https" if https_only else "http or https"
            fp.close()  # the redirect's own response, which urllib would otherwise leave open
            raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"the server redirected to a URL that is not {allowed}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_url(url: str) -> bytes:
    """Download ``url`` (http or https; a redirect never leaves https once there) within :data:`TARBALL_MAX_BYTES`.
    Plain http is for registries npm is configured with: every tarball is checked against its sha512 integrity
    before it is opened, so the transport cannot change what is vendored. (A lockfile's ``resolved`` URL is refused
    unless it is https before anything is fetched.)"""
    if not url.startswith(("https://", "http://")):
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "only http and https URLs are fetched")
    opener = urllib.request.build_opener(_NoDowngrade())
    # No credential is ever added: an Authorization header goes nowhere, whatever npm's config holds.
    request = urllib.request.Request(url, headers={"Accept": "application/octet-stream"})  # noqa: S310 - http(s) only
    try:
        with opener.open(request, timeout=60) as response:
            data: bytes = response.read(TARBALL_MAX_BYTES + 1)
    except urllib.error.HTTPError as error:
        error.close()
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, _http_failure(error.code)) from None
    except (urllib.error.URLError, OSError, ValueError):
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the download failed") from None
    if len(data) > TARBALL_MAX_BYTES:
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"the tarball is larger than {TARBALL_MAX_BYTES // 2**20} MiB")
    return data


def _http_failure(status: int) -> str:
    if status in (401, 403):
        return (
            f"the server answered HTTP {status}; registries that need a login are not supported "
            "(fill an npm cache with npm and pass it as --tarballs)"
        )
    if status == 404:
        return "the server answered HTTP 404 (no such tarball there)"
    if 300 <= status < 400:
        return f"the server answered HTTP {status}, a redirect that is not followed"
    return f"the server answered HTTP {status}"


def _unpack(label: str, tarball: bytes) -> dict[str, bytes]:
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
                    _refuse(label, f"has more than {SET_MAX_FILES} entries in its tarball")
                path = _member_path(label, member)
                if member.isdir():
                    continue
                if member.issym() or member.islnk():
                    _refuse(label, f"has a link in its tarball ({_printable(member.name)})")
                if not member.isreg():
                    _refuse(label, f"has a device or other special file in its tarball ({_printable(member.name)})")
                if path is None:
                    _refuse(label, f"has a file outside its package directory ({_printable(member.name)})")
                total += member.size
                if total > PACKAGE_MAX_BYTES:
                    _refuse(label, f"unpacks to more than {PACKAGE_MAX_BYTES // 2**20} MiB")
                if path in files:
                    _refuse(label, f"has two entries for {_printable(path)} in its tarball")
                extracted = archive.extractfile(member)
                data = extracted.read() if extracted is not None else b""
                if len(data) != member.size:
                    _refuse(label, "has a truncated tarball")
                _check_file(label, path, data)
                files[path] = data
    except (tarfile.TarError, OSError, EOFError, RecursionError, ValueError):
        _refuse(label, "has a tarball that is not a gzipped tar archive")
    for path in files:
        for parent in PurePosixPath(path).parents:
            if str(parent) in files:
                _refuse(label, f"has a file that is also a directory in its tarball ({_printable(str(parent))})")
    return files


def _gunzip(label: str, tarball: bytes) -> bytes:
    """The archive inside the gzip stream, decompressed in one bounded step: a gzip bomb, or a header the size of
    the archive, stops at :data:`ARCHIVE_MAX_BYTES` instead of filling memory."""
    decompressor = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only
    try:
        archive = decompressor.decompress(tarball, ARCHIVE_MAX_BYTES + 1)
    except zlib.error:
        _refuse(label, "has a tarball that is not gzip-compressed")
    if len(archive) > ARCHIVE_MAX_BYTES or decompressor.unconsumed_tail:
        _refuse(label, f"has a tarball that unpacks to more than {ARCHIVE_MAX_BYTES // 2**20} MiB")
    if not decompressor.eof or decompressor.unused_data:
        _refuse(label, "has a tarball that is cut short or has data after its end")
    return archive


EXTENDED_HEADER_MAX_BYTES = 8 * 1024
"""A PAX extended header (``x``) or GNU long name (``L``, ``K``): real ones hold a path and a few numbers."""


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
            _refuse(label, "has a global extended header in its tarball")
        if kind in (b"x", b"L", b"K"):
            if extended or size > EXTENDED_HEADER_MAX_BYTES:
                _refuse(label, "has an oversized or repeated extended header in its tarball")
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
        _refuse(label, "has a malformed header in its tarball")
    try:
        return int(digits or b"0", 8)
    except ValueError:
        _refuse(label, "has a malformed header in its tarball")


def _member_path(label: str, member: tarfile.TarInfo) -> str | None:
    """The entry's path without its first component; refuses absolute paths, ``..``, odd characters."""
    name = member.name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        _refuse(label, "has a path that is not UTF-8 in its tarball")
    if any(ord(char) < 0x20 or ord(char) == 0x7F or char == "\\" for char in name):
        _refuse(label, f"has a path with a control character or backslash ({_printable(name)})")
    parts = name.split("/")
    if len(name.encode()) > PATH_MAX_BYTES or any(len(part.encode()) > NAME_MAX_BYTES for part in parts):
        _refuse(label, f"has a path longer than {PATH_MAX_BYTES} bytes, or a name longer than {NAME_MAX_BYTES}")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        _refuse(label, f"has an unsafe path in its tarball ({_printable(name)}): absolute, empty, '.' or '..'")
    if "node_modules" in parts[1:]:
        _refuse(label, "carries packages of its own (node_modules in its tarball); vendor them from the lockfile")
    return "/".join(parts[1:]) or None


def _check_file(label: str, path: str, data: bytes) -> None:
    name = PurePosixPath(path).name
    if name == "binding.gyp":
        _refuse(label, f"needs building (it has {_printable(path)})")
    if name.endswith(".node") or data.startswith(b"\x7fELF"):
        _refuse(label, f"carries native code ({_printable(path)}); only pure JavaScript packages are vendored")


def _check_manifest(package: _Package, manifest: bytes | None) -> None:
    label = package.label
    if manifest is None:
        _refuse(label, "has no package.json in its tarball")
    try:
        document = json.loads(manifest, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        _refuse(label, "has a package.json that is not JSON")
    if not isinstance(document, dict):
        _refuse(label, "has a package.json that is not an object")
    fields: dict[str, Any] = document  # pyright: ignore[reportUnknownVariableType]
    if fields.get("name") not in (package.install_name, package.entry.name) or fields.get("version") != package.version:
        _refuse(label, "has a package.json whose name or version differs from the lockfile's")
    scripts: Any = fields.get("scripts")
    if isinstance(scripts, dict) and any(cast(dict[str, Any], scripts).get(name) for name in INSTALL_SCRIPTS):
        _refuse(label, "has an install script (preinstall, install or postinstall); none is ever run")
    if fields.get("gypfile") is True:
        _refuse(label, "needs building (gypfile)")


def _printable(text: str) -> str:
    """Text from a lockfile or tarball, made safe for one line of a terminal."""
    cleaned = "".join(char if char.isprintable() else "?" for char in text)
    return cleaned if len(cleaned) <= 120 else cleaned[:117] + "..."


def _refuse(label: str, reason: str) -> NoReturn:
    raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"package {label} {reason}", hint=_REFUSAL_HINT)


_REFUSAL_HINT = "change the lockfile, then build again (README, Offline package sets: what is refused and why)"
