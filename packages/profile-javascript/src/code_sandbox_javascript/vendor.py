"""Vendoring an npm ``package-lock.json`` into a package set, for ``build-image --packages``.

Every package the lockfile lists is checked before anything is fetched (:mod:`.lockfile`), its tarball, from a
directory or a download (:mod:`.tarballs`), is checked against that integrity before it is opened, and every entry
of the tarball is checked before its bytes are kept (:mod:`.unpack`). Everything happens in memory; nothing from a
package ever runs, and nothing is written to the host.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.profile import PackageSet

from code_sandbox_javascript.lockfile import locked_packages, printable, refuse
from code_sandbox_javascript.registry import Registry
from code_sandbox_javascript.tarballs import Fetch, LocalTarballs, download, fetch_url, tarball_urls
from code_sandbox_javascript.unpack import ARCHIVE_MAX_BYTES, SET_MAX_FILES, check_manifest, unpack

__all__ = ["ARCHIVE_MAX_BYTES", "SET_MAX_BYTES", "SET_MAX_FILES", "Fetch", "fetch_url", "vendor_lockfile"]

SET_MAX_BYTES = 512 * 1024 * 1024


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
    kept = locked_packages(lockfile, forbidden_names=forbidden_names, progress=progress)
    store = LocalTarballs(sources) if sources is not None else None
    urls: dict[str, tuple[str, Registry | None]] = {}
    if store is None:
        urls = tarball_urls(kept, lockfile.parent, os.environ if environ is None else environ, progress)
    progress(f"vendoring {len(kept)} packages" + (" from the given tarballs" if store else ""))
    files: dict[str, bytes] = {}
    total = 0
    for package in kept:
        tarball = store.get(package) if store is not None else download(package, *urls[package.key], fetch or fetch_url)
        if not any(hashlib.sha512(tarball).digest() == digest for digest in package.digests):
            refuse(package.label, "does not match the lockfile's integrity (sha512): the tarball was changed")
        unpacked = unpack(package.label, tarball)
        check_manifest(package, unpacked.get("package.json"))
        for path, data in unpacked.items():
            if files.setdefault(f"{package.prefix}/{path}", data) is not data:
                refuse(package.label, f"has a file that another package has too ({printable(path)})")
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
