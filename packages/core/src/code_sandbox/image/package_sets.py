"""A package set's labels and digest: what an image says it vendors, and how to check that the tree on disk is it.

The digest covers the list and every file (path and sha256) of the tree, so neither can change without the other;
build and verification compute it with the same function.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping

PACKAGES_LABEL = "io.code-sandbox.packages"
"""The set's importable packages, ``name@version`` separated by single spaces."""
PACKAGES_DIGEST_LABEL = "io.code-sandbox.packages.sha256"
"""The :func:`set_digest` of the list and the tree."""
FILE_MODE = 0o444
DIRECTORY_MODE = 0o555
"""The tree is root-owned and nothing in it is writable or executable."""

MAX_PACKAGES = 10_000
DESCRIBED_PACKAGES = 100
"""A tool description names at most this many; ``create_sandbox`` lists them all."""

_PACKAGE = re.compile(r"(@[A-Za-z0-9][A-Za-z0-9._~-]*/)?[A-Za-z0-9][A-Za-z0-9._~-]*@[0-9A-Za-z][0-9A-Za-z.+-]*")


def is_package_name(item: str) -> bool:
    """Whether ``item`` reads ``name@version`` (``@scope/name@version`` for a scoped package), nothing else."""
    return len(item) <= 256 and _PACKAGE.fullmatch(item) is not None


def set_digest(packages: Iterable[str], files: Iterable[tuple[str, str]]) -> str:
    """sha256 over the list and the tree's files, as ``(path relative to the root, sha256 hex)`` pairs."""
    material = {"packages": sorted(packages), "files": sorted(files)}
    return hashlib.sha256(json.dumps(material, separators=(",", ":")).encode()).hexdigest()


def set_labels(packages: Iterable[str], files: Mapping[str, bytes]) -> dict[str, str]:
    """The labels of an image that vendors ``files`` (path relative to the root -> content)."""
    listed = sorted(packages)
    hashed = [(path, hashlib.sha256(data).hexdigest()) for path, data in files.items()]
    return {PACKAGES_LABEL: " ".join(listed), PACKAGES_DIGEST_LABEL: set_digest(listed, hashed)}


def packages_of(labels: Mapping[str, str]) -> tuple[str, ...] | None:
    """The list an image's labels state: ``()`` when it vendors nothing, ``None`` when the labels are malformed
    (one without the other, an item that is not ``name@version``, a duplicate, too many)."""
    listed, digest = labels.get(PACKAGES_LABEL), labels.get(PACKAGES_DIGEST_LABEL)
    if listed is None and digest is None:
        return ()
    if listed is None or digest is None or re.fullmatch(r"[0-9a-f]{64}", digest) is None:
        return None
    items = listed.split(" ")
    if len(items) > MAX_PACKAGES or len(set(items)) != len(items) or not all(map(is_package_name, items)):
        return None
    return tuple(sorted(items))


def shortened(packages: tuple[str, ...]) -> list[str]:
    """The list a tool description shows: all of it, or its first :data:`DESCRIBED_PACKAGES` and a count."""
    if len(packages) <= DESCRIBED_PACKAGES:
        return list(packages)
    left = len(packages) - DESCRIBED_PACKAGES
    return [*packages[:DESCRIBED_PACKAGES], f"and {left} more (create_sandbox lists them all)"]
