"""Reading an npm ``package-lock.json`` (lockfileVersion 2 or 3) for ``build-image --packages``: every entry is
checked before anything is fetched (a registry package with a sha512 integrity, no install script, not bundled, not
a link, for this platform or optional), so that a lockfile that cannot build fails before any download.
"""

from __future__ import annotations

import base64
import platform
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.jsonvalue import parse_json
from pydantic import BaseModel, ConfigDict, Field, ValidationError

LOCKFILE_MAX_BYTES = 32 * 1024 * 1024

_NAME = r"(?!node_modules(?:/|$))(?!favicon\.ico(?:/|$))[A-Za-z0-9][A-Za-z0-9._~-]*"
_INSTALL_NAME = rf"(?:@{_NAME}/)?{_NAME}"
PACKAGE_NAME = re.compile(_INSTALL_NAME)
"""A package name npm accepts, scoped or not."""

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


class LockedPackage:
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


def locked_packages(
    lockfile: Path, *, forbidden_names: Iterable[str], progress: Callable[[str], None]
) -> list[LockedPackage]:
    """The packages ``lockfile`` lists for this platform, each checked as far as it can be without its tarball;
    an optional package for another platform is skipped, any other refused.

    :param forbidden_names: package names refused outright (package managers).
    """
    packages = [_checked_entry(key, entry, frozenset(forbidden_names)) for key, entry in _read_lockfile(lockfile)]
    here = ("linux", _NODE_ARCH.get(platform.machine().lower(), platform.machine().lower()), "glibc")
    kept: list[LockedPackage] = []
    for package in packages:
        entry = package.entry
        if _allows(entry.os, here[0]) and _allows(entry.cpu, here[1]) and _allows(entry.libc, here[2]):
            kept.append(package)
        elif entry.optional:
            progress(f"skipping {package.label}: an optional package for another platform")
        else:
            refuse(package.label, f"is for another platform (os {entry.os}, cpu {entry.cpu}, libc {entry.libc})")
    keys = {package.key for package in kept}
    for package in kept:
        if package.parent is not None and package.parent not in keys:
            refuse(package.label, "is nested under a package that the lockfile does not list")
    if not any(package.importable for package in kept):
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "the lockfile lists no packages to vendor")
    return kept


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
        document = parse_json(raw)
    except (ValueError, RecursionError):
        fail("is not JSON")
    if not isinstance(document, dict):
        fail("is not a package-lock.json")
    version = document.get("lockfileVersion")
    if version not in (2, 3):  # True == 1: a boolean is refused too
        fail(f"has lockfileVersion {version!r}; 2 or 3 is needed (npm 7 or later writes them)")
    entries = document.get("packages")
    if not isinstance(entries, dict):
        fail("has no packages section")
    checked: list[tuple[str, LockEntry]] = []
    for key in sorted(entries):
        if key == "":
            continue  # the project itself
        try:
            checked.append((key, LockEntry.model_validate(entries[key])))
        except ValidationError:
            fail(f"has a malformed entry at {printable(key)}")
    return checked


_LOCKFILE_HINT = "make it with `npm install --package-lock-only` (see README, Offline package sets)"


def _checked_entry(key: str, entry: LockEntry, forbidden: frozenset[str]) -> LockedPackage:
    """Every check that needs no tarball, so that a lockfile that cannot build fails before any download."""
    matched = _KEY.fullmatch(key)
    if entry.link or matched is None:
        refuse(printable(key), "is a link, a workspace package or a name npm refuses, not a registry package")
    name = matched["name"]
    version = entry.version or ""
    label = f"{name}@{printable(version)}"
    if _VERSION.fullmatch(version) is None:
        refuse(label, "has no plain version (an alias, a git or file source, or a tag)")
    if entry.resolved is not None and not entry.resolved.startswith("https://"):
        refuse(label, "does not come from a registry over https (git, file, link and http sources are refused)")
    if entry.in_bundle:
        refuse(label, "is bundled inside another package; only packages from the registry are vendored")
    if entry.has_install_script:
        refuse(label, "has an install script (it needs building or runs code at install); none is ever run")
    if {name, entry.name or ""} & forbidden:
        refuse(label, "is a package manager, which the image must not carry")
    digests = _sha512_digests(entry.integrity or "")
    if not digests:
        refuse(label, "has no sha512 integrity in the lockfile")
    return LockedPackage(key, name, entry, version, digests)


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


def printable(text: str) -> str:
    """Text from a lockfile or tarball, made safe for one line of a terminal."""
    cleaned = "".join(char if char.isprintable() else "?" for char in text)
    return cleaned if len(cleaned) <= 120 else cleaned[:117] + "..."


def refuse(label: str, reason: str) -> NoReturn:
    """Refuse the package ``label`` (name@version) for ``reason``: the one error every check of a package raises,
    here, in :mod:`.tarballs` and in :mod:`.unpack`."""
    raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"package {label} {reason}", hint=_REFUSAL_HINT)


_REFUSAL_HINT = "change the lockfile, then build again (README, Offline package sets: what is refused and why)"
