"""Where a package's tarball comes from: a directory of tarballs or an npm cache, found by the lockfile's sha512
integrity, or a download from the entry's ``resolved`` URL or, for an entry without one (npm's
``omit-lockfile-registry-resolved``), from the registry npm is configured with (:mod:`.registry`). Whatever the
source, the caller checks each tarball against its integrity before it is opened.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from http.client import HTTPMessage
from pathlib import Path
from typing import IO

from code_sandbox.errors import ErrorCode, SandboxError

from code_sandbox_javascript.lockfile import PACKAGE_NAME, LockedPackage, printable, refuse
from code_sandbox_javascript.registry import NpmConfig, Registry, load_npm_config

TARBALL_MAX_BYTES = 64 * 1024 * 1024
"""A package's compressed tarball."""

Fetch = Callable[[str], bytes]
"""Downloads an http or https URL (a lockfile's https ``resolved``, or a tarball URL on npm's registry) and returns
the body."""


class LocalTarballs:
    """Tarballs found by their sha512 in a directory of ``.tgz`` files or in an npm cache (``_cacache``)."""

    def __init__(self, directory: Path) -> None:
        self.cache: Path | None = None
        for candidate in (directory / "_cacache", directory):
            if (candidate / "content-v2").is_dir():
                self.cache = candidate / "content-v2" / "sha512"
                break
        self.directory = directory
        self._index: dict[bytes, Path] | None = None

    def get(self, package: LockedPackage) -> bytes:
        for digest in package.digests:
            path = self._find(digest)
            if path is not None:
                return _read_tarball(path, package.label)
        refuse(package.label, "is not among the given tarballs (looked up by its sha512 integrity)")

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
        refuse(label, "has a tarball that cannot be read")
    if len(data) > TARBALL_MAX_BYTES:
        refuse(label, f"has a tarball larger than {TARBALL_MAX_BYTES // 2**20} MiB")
    return data


def tarball_urls(
    packages: list[LockedPackage], project: Path, environ: Mapping[str, str], progress: Callable[[str], None]
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
        if PACKAGE_NAME.fullmatch(name) is None:
            refuse(package.label, "is an alias of a name npm refuses")
        if config is None:
            config = load_npm_config(project, environ)
        registry = config.registry_for(name)
        urls[package.key] = (registry.tarball_url(name, package.version), registry)
        counts[registry] = counts.get(registry, 0) + 1
    for registry, count in counts.items():
        progress(
            f"{count} {'package' if count == 1 else 'packages'} without a resolved URL from "
            f"{printable(registry.shown)} ({registry.source})"
            + (": plain http, each tarball still checked against its integrity" if registry.plain_http else "")
        )
    return urls


def download(package: LockedPackage, url: str, registry: Registry | None, fetch: Fetch) -> bytes:
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

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        https_only = req.full_url.startswith("https://")
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
