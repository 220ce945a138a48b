"""Vendoring an npm lockfile (``build-image --packages``): what is taken, and everything that is refused.

A real tarball (ms@2.1.3, as the registry serves it) shows the normal path; hostile packages are made here in
memory, each with a correct integrity so that only the property under test makes it fail.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.profile import PackageSet
from code_sandbox_javascript.registry import Registry, load_npm_config, npm_default_registry, parse_npmrc
from code_sandbox_javascript.vendor import ARCHIVE_MAX_BYTES, fetch_url, vendor_lockfile

from tests.support.npm_registry import LoopbackRegistry

DATA = Path(__file__).parent / "data" / "packages"
MS_TARBALL = DATA / "ms-2.1.3.tgz"
MS_INTEGRITY = "sha512-6FlzubTLZG3J2a/NVCAleEhjzq5oxgHyaCU9yYXvcLsvoVaHJq/s5xXI6/XXP6tz7R9xAOtHnSO/tXtF3WRTlA=="
PACKAGE_MANAGERS = ("npm", "npx", "corepack", "yarn", "pnpm")


def integrity(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def tarball(files: dict[str, bytes], *, extra: Callable[[tarfile.TarFile], None] | None = None) -> bytes:
    """A gzipped tar with ``files`` as given (names unchanged: the test decides on the ``package/`` prefix)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in files.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            archive.addfile(entry, io.BytesIO(data))
        if extra is not None:
            extra(archive)
    return buffer.getvalue()


def manifest(name: str, version: str = "1.0.0", **fields: Any) -> bytes:
    return json.dumps({"name": name, "version": version, **fields}).encode()


def lockfile(directory: Path, entries: dict[str, dict[str, Any]], *, version: int = 3) -> Path:
    path = directory / "package-lock.json"
    document = {"name": "set", "lockfileVersion": version, "requires": True,
                "packages": {"": {"name": "set"}, **entries}}  # fmt: skip
    path.write_text(json.dumps(document))
    return path


class Set:
    """A lockfile and a directory of tarballs, built up one package at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tarballs = root / "tarballs"
        self.tarballs.mkdir()
        self.entries: dict[str, dict[str, Any]] = {}

    def add(self, key: str, data: bytes, **entry: Any) -> None:
        (self.tarballs / f"{len(self.entries)}.tgz").write_bytes(data)
        self.entries[key] = {"version": "1.0.0", "integrity": integrity(data), **entry}

    def add_package(self, name: str, files: dict[str, bytes], key: str | None = None, **entry: Any) -> None:
        contents = {"package/package.json": manifest(name, entry.get("version", "1.0.0")), **files}
        self.add(key or f"node_modules/{name}", tarball(contents), **entry)

    def vendor(self, **options: Any) -> PackageSet:
        lock = lockfile(self.root, self.entries)
        return vendor_lockfile(lock, sources=self.tarballs, progress=lambda _text: None, **options)

    def refusal(self, **options: Any) -> str:
        with pytest.raises(SandboxError) as raised:
            self.vendor(forbidden_names=PACKAGE_MANAGERS, **options)
        assert raised.value.code is ErrorCode.IMAGE_BUILD_FAILED
        return raised.value.message


@pytest.fixture
def packages(tmp_path: Path) -> Set:
    return Set(tmp_path)


def ms_entry() -> dict[str, Any]:
    return {"version": "2.1.3", "integrity": MS_INTEGRITY, "license": "MIT"}


def test_a_real_package_is_vendored_from_a_directory_of_tarballs(tmp_path: Path) -> None:
    sources = tmp_path / "tarballs"
    sources.mkdir()
    (sources / "any-name.tgz").write_bytes(MS_TARBALL.read_bytes())  # found by content, not by name
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    vendored = vendor_lockfile(lock, sources=sources, progress=lambda _text: None)
    assert vendored.packages == ("ms@2.1.3",)
    assert sorted(vendored.files) == ["ms/index.js", "ms/license.md", "ms/package.json", "ms/readme.md"]
    with tarfile.open(MS_TARBALL) as archive:
        extracted = archive.extractfile("package/index.js")
        assert extracted is not None and vendored.files["ms/index.js"] == extracted.read()


def test_tarballs_are_found_in_an_npm_cache_by_their_integrity(tmp_path: Path) -> None:
    data = MS_TARBALL.read_bytes()
    digest = hashlib.sha512(data).hexdigest()
    content = tmp_path / "npm" / "_cacache" / "content-v2" / "sha512" / digest[:2] / digest[2:4] / digest[4:]
    content.parent.mkdir(parents=True)
    content.write_bytes(data)
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    vendored = vendor_lockfile(lock, sources=tmp_path / "npm", progress=lambda _text: None)
    assert vendored.packages == ("ms@2.1.3",)


def test_a_changed_tarball_in_an_npm_cache_is_refused(tmp_path: Path) -> None:
    data = MS_TARBALL.read_bytes()
    digest = hashlib.sha512(data).hexdigest()
    content = tmp_path / "_cacache" / "content-v2" / "sha512" / digest[:2] / digest[2:4] / digest[4:]
    content.parent.mkdir(parents=True)
    content.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # stored under the right digest, but not those bytes
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(lock, sources=tmp_path, progress=lambda _text: None)
    assert "package ms@2.1.3 does not match the lockfile's integrity" in raised.value.message


def test_without_a_directory_each_tarball_is_downloaded_from_its_resolved_url(tmp_path: Path) -> None:
    url = "https://packages.example/ms/-/ms-2.1.3.tgz"
    fetched: list[str] = []

    def fetch(address: str) -> bytes:
        fetched.append(address)
        return MS_TARBALL.read_bytes()

    lock = lockfile(tmp_path, {"node_modules/ms": {**ms_entry(), "resolved": url}})
    vendored = vendor_lockfile(lock, sources=None, progress=lambda _text: None, fetch=fetch)
    assert (vendored.packages, fetched) == (("ms@2.1.3",), [url])


def test_a_download_that_is_not_http_or_https_is_refused_before_any_connection() -> None:
    with pytest.raises(SandboxError) as raised:
        fetch_url("ftp://127.0.0.1:9/ms.tgz")  # port 9 (discard): nothing would answer anyway
    assert "https" in raised.value.message


def test_an_entry_without_a_url_comes_from_npms_default_registry_when_nothing_sets_one(tmp_path: Path) -> None:
    fetched: list[str] = []

    def fetch(address: str) -> bytes:
        fetched.append(address)
        return MS_TARBALL.read_bytes()

    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    environ = {"HOME": str(tmp_path / "home"), "PATH": ""}
    vendored = vendor_lockfile(lock, sources=None, progress=lambda _text: None, fetch=fetch, environ=environ)
    default = npm_default_registry({"PATH": ""})  # the pinned Node.js wheel's npm, asked
    assert default.startswith("https://") and default.endswith("/")
    assert (vendored.packages, fetched) == (("ms@2.1.3",), [default + "ms/-/ms-2.1.3.tgz"])


def test_npms_default_is_not_steered_by_an_npmrc_in_a_parent_of_the_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another user's files in a shared /tmp: npm would take their folder as the project root, and their .npmrc.
    (tmp_path / "package.json").write_text("{}")
    (tmp_path / ".npmrc").write_text("registry=https://evil.invalid/${SECRET_OF_THE_OPERATOR}/\n")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    default = npm_default_registry({"PATH": "", "SECRET_OF_THE_OPERATOR": "s3cr3t"})
    assert "evil" not in default and "s3cr3t" not in default and default.startswith("https://")


def test_npms_default_is_what_npm_says_with_no_config_but_its_own(tmp_path: Path) -> None:
    (tmp_path / ".npmrc").write_text("registry=http://127.0.0.1:9/\n")
    environ = {"PATH": "", "HOME": str(tmp_path), "npm_config_registry": "http://127.0.0.1:9/"}
    assert npm_default_registry(environ) == npm_default_registry({"PATH": ""})  # neither setting reached it
    assert npm_default_registry({"PATH": ""}).startswith("https://")


def test_a_tampered_tarball_is_refused_naming_the_package(tmp_path: Path) -> None:
    sources = tmp_path / "tarballs"
    sources.mkdir()
    data = bytearray(MS_TARBALL.read_bytes())
    data[-20] ^= 0x01
    (sources / "ms-2.1.3.tgz").write_bytes(bytes(data))
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(lock, sources=sources, progress=lambda _text: None)
    # Not found by its integrity: the changed tarball is never used.
    assert "ms@2.1.3" in raised.value.message and "not among the given tarballs" in raised.value.message


def test_a_downloaded_tarball_that_does_not_match_its_integrity_is_refused(tmp_path: Path) -> None:
    lock = lockfile(tmp_path, {"node_modules/ms": {**ms_entry(), "resolved": "https://packages.example/ms.tgz"}})
    changed = MS_TARBALL.read_bytes() + b"\0"
    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(lock, sources=None, progress=lambda _text: None, fetch=lambda _url: changed)
    assert "package ms@2.1.3 does not match the lockfile's integrity" in raised.value.message


def test_a_tarball_with_a_parent_path_is_refused(packages: Set) -> None:
    packages.add_package("evil", {"package/../../../etc/cron.d/x": b"x"})
    assert packages.refusal() == (
        "package evil@1.0.0 has an unsafe path in its tarball (package/../../../etc/cron.d/x): absolute, empty, "
        "'.' or '..'"
    )


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("/etc/passwd", "unsafe path"),
        ("package//index.js", "unsafe path"),
        ("package/./index.js", "unsafe path"),
        ("package/a\nb.js", "control character"),
        ("package/a\\b.js", "backslash"),
        ("index.js", "outside its package directory"),
        ("package/node_modules/other/index.js", "carries packages of its own"),
    ],
)
def test_unsafe_tarball_paths_are_refused(packages: Set, name: str, reason: str) -> None:
    packages.add_package("evil", {name: b"x"})
    assert reason in packages.refusal()


def _link(kind: bytes, target: str) -> Callable[[tarfile.TarFile], None]:
    def add(archive: tarfile.TarFile) -> None:
        entry = tarfile.TarInfo("package/link.js")
        entry.type = kind
        entry.linkname = target
        archive.addfile(entry)

    return add


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (_link(tarfile.SYMTYPE, "/etc/shadow"), "has a link"),
        (_link(tarfile.SYMTYPE, "index.js"), "has a link"),  # even one that stays inside
        (_link(tarfile.LNKTYPE, "package/package.json"), "has a link"),
        (_link(tarfile.CHRTYPE, ""), "special file"),
        (_link(tarfile.FIFOTYPE, ""), "special file"),
    ],
)
def test_links_and_special_files_are_refused(
    packages: Set, extra: Callable[[tarfile.TarFile], None], reason: str
) -> None:
    packages.add("node_modules/evil", tarball({"package/package.json": manifest("evil")}, extra=extra))
    assert reason in packages.refusal()


def test_a_package_with_an_install_script_is_refused(packages: Set) -> None:
    scripts = manifest("builds", scripts={"postinstall": "node setup.js", "test": "x"})
    packages.add("node_modules/builds", tarball({"package/package.json": scripts}))
    assert packages.refusal() == (
        "package builds@1.0.0 has an install script (preinstall, install or postinstall); none is ever run"
    )


def test_a_lockfile_entry_with_an_install_script_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    lock = lockfile(tmp_path, {"node_modules/builds": {"version": "1.0.0", "integrity": MS_INTEGRITY,
                                                       "hasInstallScript": True,
                                                       "resolved": "https://packages.example/b.tgz"}})  # fmt: skip

    def fetch(_url: str) -> bytes:
        raise AssertionError("nothing is downloaded for a lockfile that cannot build")

    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(lock, sources=None, progress=lambda _text: None, fetch=fetch)
    assert "package builds@1.0.0 has an install script" in raised.value.message


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({"package/binding.gyp": b"{}"}, "needs building"),
        ({"package/build/Release/addon.node": b"anything"}, "carries native code"),
        ({"package/bin/tool": b"\x7fELF\x02\x01\x01"}, "carries native code"),
    ],
)
def test_packages_that_need_building_or_carry_native_code_are_refused(
    packages: Set, files: dict[str, bytes], reason: str
) -> None:
    packages.add_package("native", files)
    assert reason in packages.refusal()


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"resolved": "git+ssh://git@example.com/a/b.git#0123abcd"}, "does not come from a registry over https"),
        ({"resolved": "file:../local.tgz"}, "does not come from a registry over https"),
        ({"resolved": "http://packages.example/a.tgz"}, "does not come from a registry over https"),
        ({"link": True, "resolved": "packages/a"}, "is a link, a workspace package"),
        ({"version": "github:a/b"}, "has no plain version"),
        ({"integrity": "sha1-2jmj7l5rSw0yVb/vlWAYkK/YBwk="}, "has no sha512 integrity"),
        ({"integrity": None}, "has no sha512 integrity"),
        ({"inBundle": True}, "is bundled inside another package"),
    ],
)
def test_non_registry_and_unpinned_entries_are_refused(packages: Set, entry: dict[str, Any], reason: str) -> None:
    packages.add_package("pkg", {"package/index.js": b"module.exports = 1\n"}, **entry)
    assert reason in packages.refusal()


def test_a_workspace_key_is_refused(packages: Set) -> None:
    packages.add_package("pkg", {}, key="packages/pkg")
    assert "is a link, a workspace package" in packages.refusal()


def test_a_package_manager_is_refused(packages: Set) -> None:
    packages.add_package("npm", {"package/index.js": b""})
    assert packages.refusal() == "package npm@1.0.0 is a package manager, which the image must not carry"


def test_a_manifest_that_differs_from_the_lockfile_is_refused(packages: Set) -> None:
    packages.add("node_modules/ms", tarball({"package/package.json": manifest("not-ms")}))
    assert "name or version differs" in packages.refusal()


def test_lockfiles_that_are_not_version_2_or_3_are_refused(tmp_path: Path) -> None:
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()}, version=1)
    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(lock, sources=tmp_path, progress=lambda _text: None)
    assert "lockfileVersion 1" in raised.value.message


def test_nested_packages_are_vendored_under_their_parent_and_only_top_level_ones_are_listed(packages: Set) -> None:
    packages.add_package("app-util", {"package/index.js": b"module.exports = require('dep')\n"})
    packages.add_package(
        "dep",
        {"package/index.js": b"module.exports = 2\n"},
        key="node_modules/app-util/node_modules/dep",
        version="2.0.0",
    )
    packages.add_package("@scope/thing", {"package/index.js": b""})
    vendored = packages.vendor()
    assert vendored.packages == ("@scope/thing@1.0.0", "app-util@1.0.0")
    assert "app-util/node_modules/dep/index.js" in vendored.files
    assert "@scope/thing/package.json" in vendored.files


def test_an_optional_package_for_another_platform_is_skipped(packages: Set) -> None:
    packages.add_package("portable", {"package/index.js": b""})
    packages.add_package("mac-only", {"package/index.js": b""}, optional=True, os=["darwin"])
    assert packages.vendor().packages == ("portable@1.0.0",)


def test_a_required_package_for_another_platform_is_refused(packages: Set) -> None:
    packages.add_package("windows-only", {"package/index.js": b""}, os=["win32"])
    assert "is for another platform" in packages.refusal()


def test_the_example_lockfile_passes_every_check_that_needs_no_tarball(tmp_path: Path) -> None:
    # Every entry is checked before the first tarball is looked for: failing on the first lookup proves that the
    # whole example lockfile (containers/packages) is acceptable as it stands.
    example = Path(__file__).parents[1] / "containers" / "packages" / "package-lock.json"
    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(example, sources=tmp_path, progress=lambda _text: None, forbidden_names=PACKAGE_MANAGERS)
    assert (
        raised.value.message
        == "package dayjs@1.11.23 is not among the given tarballs (looked up by its sha512 integrity)"
    )


def test_a_gzip_bomb_is_refused_before_it_fills_memory(packages: Set) -> None:
    # One member of zeros a little past the archive limit, compressed about a thousand to one: written in pieces,
    # so that the test itself never holds it decompressed either.
    size = ARCHIVE_MAX_BYTES + 1024 * 1024
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", compresslevel=9) as compressed:
        entry = tarfile.TarInfo("package/zeros.bin")
        entry.size = size
        compressed.write(entry.tobuf(format=tarfile.PAX_FORMAT))
        piece = bytes(8 * 1024 * 1024)
        for _ in range(size // len(piece)):
            compressed.write(piece)
    assert len(buffer.getvalue()) < 1024 * 1024
    packages.add("node_modules/bomb", buffer.getvalue())
    assert "has a tarball that unpacks to more than 256 MiB" in packages.refusal()


def test_overlong_paths_are_refused(packages: Set) -> None:
    packages.add_package("deep", {"package/" + "a/" * 600 + "index.js": b""})
    assert "has a path longer than 1024 bytes" in packages.refusal()


def _extended(kind: bytes, size: int) -> bytes:
    """A raw tar header of ``kind`` announcing ``size`` bytes, and those bytes (digits, as in the slow PAX case)."""
    header = bytearray(512)
    header[0:8] = b"././@Px\0"
    header[100:108] = b"0000644\0"
    header[124:136] = f"{size:011o}\0".encode()
    header[156:157] = kind
    header[257:263] = b"ustar\0"
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    return bytes(header) + b"9" * size + bytes(-size % 512)


@pytest.mark.parametrize(
    "headers",
    [
        _extended(b"x", 64 * 1024),  # a header of digits that the tarfile module would take minutes to parse
        _extended(b"x", 100) + _extended(b"x", 100),  # chained: tarfile would recurse once per header
        _extended(b"L", 100) + _extended(b"x", 100),
        _extended(b"g", 100),
    ],
)
def test_oversized_chained_and_global_extended_headers_are_refused(packages: Set, headers: bytes) -> None:
    body = tarball({"package/package.json": manifest("slow")})
    raw = gzip.decompress(body)
    packages.add("node_modules/slow", gzip.compress(headers + raw))
    assert "extended header" in packages.refusal()


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("node_modules/node_modules", "a name npm refuses"),
        ("node_modules/ghost/node_modules/q", "nested under a package that the lockfile does not list"),
    ],
)
def test_keys_npm_would_not_write_are_refused(packages: Set, key: str, reason: str) -> None:
    packages.add_package("q", {"package/index.js": b""}, key=key)
    assert reason in packages.refusal()


def test_a_scope_that_contains_node_modules_is_listed_by_its_whole_name(packages: Set) -> None:
    packages.add_package("@xnode_modules/y", {"package/index.js": b""})
    vendored = packages.vendor()
    assert vendored.packages == ("@xnode_modules/y@1.0.0",)
    assert "@xnode_modules/y/index.js" in vendored.files


# Lockfiles without ``resolved`` (npm's omit-lockfile-registry-resolved): the tarball comes from the registry npm is
# configured with. Each test reads npm's config from a given environment, never the machine's, and downloads only
# from registries it serves on loopback.


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackRegistry]:
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # a proxy from the environment must not carry loopback requests
    with LoopbackRegistry() as served:
        yield served


def npm_environment(root: Path, **settings: str) -> dict[str, str]:
    """An environment with an empty home and no node on PATH (so no global npmrc), plus ``settings``."""
    (root / "home").mkdir(exist_ok=True)
    return {"HOME": str(root / "home"), "PATH": "", **settings}


def vendor_without_urls(root: Path, environ: dict[str, str], entries: dict[str, dict[str, Any]]) -> PackageSet:
    return vendor_lockfile(lockfile(root, entries), sources=None, progress=lambda _text: None, environ=environ)


def vendor_refusal(root: Path, environ: dict[str, str], entries: dict[str, dict[str, Any]]) -> SandboxError:
    with pytest.raises(SandboxError) as raised:
        vendor_without_urls(root, environ, entries)
    assert raised.value.code is ErrorCode.IMAGE_BUILD_FAILED
    return raised.value


def test_an_entry_without_resolved_is_downloaded_from_the_registry_in_the_projects_npmrc(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    registry.files["/mirror/npm/ms/-/ms-2.1.3.tgz"] = MS_TARBALL.read_bytes()
    (tmp_path / ".npmrc").write_text(f"; the team's mirror\nregistry = {registry.url}/mirror/npm/ # trailing comment\n")
    progress: list[str] = []
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    vendored = vendor_lockfile(lock, sources=None, progress=progress.append, environ=npm_environment(tmp_path))
    assert vendored.packages == ("ms@2.1.3",) and "ms/index.js" in vendored.files
    assert registry.paths == ["/mirror/npm/ms/-/ms-2.1.3.tgz"]
    assert any("`registry` in the project .npmrc" in line and "plain http" in line for line in progress)


def test_the_build_names_a_registry_by_its_host_alone_as_some_carry_a_token_in_their_path(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    registry.files["/tok_S3CR3T/acme/ms/-/ms-2.1.3.tgz"] = MS_TARBALL.read_bytes()
    progress: list[str] = []
    upper_scheme = "HTTP" + registry.url.removeprefix("http")
    environ = npm_environment(tmp_path, npm_config_registry=upper_scheme + "/tok_${TOKEN}/acme/", TOKEN="S3CR3T")  # noqa: S106
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    vendored = vendor_lockfile(lock, sources=None, progress=progress.append, environ=environ)
    assert vendored.packages == ("ms@2.1.3",)
    assert registry.paths == ["/tok_S3CR3T/acme/ms/-/ms-2.1.3.tgz"]
    [line] = [line for line in progress if "without a resolved URL" in line]
    assert "S3CR3T" not in line and f"from {registry.url} (`registry` in the environment)" in line
    assert "plain http" in line  # an upper-case scheme is still seen as plain http


@pytest.mark.parametrize("variable", ["npm_config_registry", "NPM_CONFIG_REGISTRY"])
def test_the_registry_in_the_environment_is_used_before_the_projects_npmrc(
    tmp_path: Path, registry: LoopbackRegistry, variable: str
) -> None:
    registry.files["/ms/-/ms-2.1.3.tgz"] = MS_TARBALL.read_bytes()
    (tmp_path / ".npmrc").write_text("registry=http://127.0.0.1:9/\n")  # port 9 (discard): never reached
    environ = npm_environment(tmp_path, **{variable: registry.url})
    assert vendor_without_urls(tmp_path, environ, {"node_modules/ms": ms_entry()}).packages == ("ms@2.1.3",)
    assert registry.paths == ["/ms/-/ms-2.1.3.tgz"]


def test_a_scoped_package_comes_from_its_scopes_registry_and_the_rest_from_the_default_one(tmp_path: Path) -> None:
    util = tarball({"package/package.json": manifest("@corp/util"), "package/index.js": b"module.exports = 2\n"})
    with LoopbackRegistry() as public, LoopbackRegistry() as corporate:
        public.files["/ms/-/ms-2.1.3.tgz"] = MS_TARBALL.read_bytes()
        corporate.files["/@corp/util/-/util-1.0.0.tgz"] = util
        (tmp_path / ".npmrc").write_text(f"registry={public.url}\n")
        environ = npm_environment(tmp_path, **{"no_proxy": "127.0.0.1", "npm_config_@corp:registry": corporate.url})
        entries = {"node_modules/ms": ms_entry(), "node_modules/@corp/util": {"version": "1.0.0",
                   "integrity": integrity(util)}}  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("no_proxy", "127.0.0.1")
            vendored = vendor_without_urls(tmp_path, environ, entries)
        assert vendored.packages == ("@corp/util@1.0.0", "ms@2.1.3")
        assert (public.paths, corporate.paths) == (["/ms/-/ms-2.1.3.tgz"], ["/@corp/util/-/util-1.0.0.tgz"])


def test_a_tarball_from_the_registry_that_does_not_match_its_integrity_is_refused(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    registry.files["/ms/-/ms-2.1.3.tgz"] = MS_TARBALL.read_bytes() + b"\0"
    environ = npm_environment(tmp_path, npm_config_registry=registry.url)
    refusal = vendor_refusal(tmp_path, environ, {"node_modules/ms": ms_entry()})
    assert "package ms@2.1.3 does not match the lockfile's integrity" in refusal.message


def test_an_entry_without_resolved_or_integrity_is_refused_before_any_download(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    environ = npm_environment(tmp_path, npm_config_registry=registry.url)
    entry = {"version": "2.1.3"}
    assert "has no sha512 integrity" in vendor_refusal(tmp_path, environ, {"node_modules/ms": entry}).message
    assert registry.requests == []


def test_a_registry_that_asks_for_a_login_is_refused_and_no_token_is_ever_sent(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    registry.statuses["/ms/-/ms-2.1.3.tgz"] = 401
    user = tmp_path / "user.npmrc"
    host = registry.url.removeprefix("http:")
    user.write_text(f"registry={registry.url}/\n{host}/:_authToken=s3cr3t-token\n{host}/:_auth=dXNlcjpwYXNz\n")
    environ = npm_environment(tmp_path, NPM_CONFIG_USERCONFIG=str(user))
    refusal = vendor_refusal(tmp_path, environ, {"node_modules/ms": ms_entry()})
    assert "HTTP 401" in refusal.message and "the user's npmrc" in refusal.message
    assert refusal.hint is not None and "--tarballs" in refusal.hint
    assert "s3cr3t" not in str(refusal) and "s3cr3t" not in refusal.hint
    assert [headers.get("authorization") for _path, headers in registry.requests] == [None]


def test_a_registry_missing_a_tarball_names_the_package_and_where_the_registry_was_set(
    tmp_path: Path, registry: LoopbackRegistry
) -> None:
    environ = npm_environment(tmp_path, npm_config_registry=registry.url)
    refusal = vendor_refusal(tmp_path, environ, {"node_modules/ms": ms_entry()})
    assert refusal.message == (
        "package ms@2.1.3 could not be downloaded from the registry named by `registry` in the environment: "
        "the server answered HTTP 404 (no such tarball there)"
    )


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("ftp://127.0.0.1/ms.tgz", "the server redirected to a URL that is not http or https"),
        ("file:///etc/passwd", "the server answered HTTP 302, a redirect that is not followed"),
    ],
)
def test_a_registry_redirect_to_another_scheme_is_refused(
    tmp_path: Path, registry: LoopbackRegistry, target: str, reason: str
) -> None:
    registry.redirects["/ms/-/ms-2.1.3.tgz"] = target
    environ = npm_environment(tmp_path, npm_config_registry=registry.url)
    refusal = vendor_refusal(tmp_path, environ, {"node_modules/ms": ms_entry()})
    assert refusal.message.endswith(reason) and registry.paths == ["/ms/-/ms-2.1.3.tgz"]


def test_a_registry_redirect_on_http_is_followed(tmp_path: Path, registry: LoopbackRegistry) -> None:
    registry.redirects["/ms/-/ms-2.1.3.tgz"] = f"{registry.url}/blobs/ms"
    registry.files["/blobs/ms"] = MS_TARBALL.read_bytes()
    environ = npm_environment(tmp_path, npm_config_registry=registry.url)
    assert vendor_without_urls(tmp_path, environ, {"node_modules/ms": ms_entry()}).packages == ("ms@2.1.3",)
    assert registry.paths == ["/ms/-/ms-2.1.3.tgz", "/blobs/ms"]


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("file:///etc/npm/", "is not an http or https URL"),
        ("ftp://127.0.0.1/npm/", "is not an http or https URL"),
        ("javascript:alert(1)//", "is not an http or https URL"),
        ("127.0.0.1:4873", "is not an http or https URL"),
        ("https://", "has no host"),
        ("https://user:pa55word@127.0.0.1/", "carries credentials"),
        ("https://127.0.0.1/npm?token=pa55word", "has a query or a fragment"),
        ("https://127.0.0.1:99999999/", "is not a URL"),
        ("https://127.0.0.1/\x1b]0;owned\x07/", "has a space or a control character"),
    ],
)
def test_a_registry_that_is_not_a_plain_http_or_https_url_is_refused_before_any_download(
    tmp_path: Path, value: str, reason: str
) -> None:
    fetched: list[str] = []

    def fetch(address: str) -> bytes:
        fetched.append(address)
        return b""

    (tmp_path / ".npmrc").write_text(f"registry={json.dumps(value)}\n")
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(lock, sources=None, progress=lambda _t: None, fetch=fetch, environ=npm_environment(tmp_path))
    assert raised.value.code is ErrorCode.IMAGE_BUILD_FAILED and fetched == []
    assert raised.value.message.startswith(f"the registry named by `registry` in the project .npmrc {reason}")
    assert "pa55word" not in str(raised.value) and "\x1b" not in str(raised.value)


def test_with_tarballs_npms_config_is_never_read(tmp_path: Path) -> None:
    (tmp_path / ".npmrc").write_text("registry=file:///nowhere/\n")  # refused if it were read
    sources = tmp_path / "tarballs"
    sources.mkdir()
    (sources / "ms.tgz").write_bytes(MS_TARBALL.read_bytes())
    lock = lockfile(tmp_path, {"node_modules/ms": ms_entry()})
    vendored = vendor_lockfile(lock, sources=sources, progress=lambda _t: None, environ=npm_environment(tmp_path))
    assert vendored.packages == ("ms@2.1.3",)


def test_an_alias_without_resolved_is_fetched_by_its_real_name(tmp_path: Path) -> None:
    fetched: list[str] = []

    def fetch(address: str) -> bytes:
        fetched.append(address)
        return MS_TARBALL.read_bytes()

    lock = lockfile(tmp_path, {"node_modules/tiny-ms": {**ms_entry(), "name": "ms"}})
    environ = npm_environment(tmp_path, npm_config_registry="http://127.0.0.1:9/npm")
    vendored = vendor_lockfile(lock, sources=None, progress=lambda _t: None, fetch=fetch, environ=environ)
    assert (vendored.packages, fetched) == (("tiny-ms@2.1.3",), ["http://127.0.0.1:9/npm/ms/-/ms-2.1.3.tgz"])


def test_an_alias_of_a_name_npm_refuses_is_refused_without_a_url(tmp_path: Path) -> None:
    lock = lockfile(tmp_path, {"node_modules/ms": {**ms_entry(), "name": "../../x"}})
    with pytest.raises(SandboxError) as raised:
        vendor_lockfile(lock, sources=None, progress=lambda _t: None, environ=npm_environment(tmp_path))
    assert raised.value.message == "package ms@2.1.3 is an alias of a name npm refuses"


def test_tarball_urls_keep_the_scopes_slash_and_drop_the_scope_from_the_file_name() -> None:
    registry = Registry(url="https://packages.example/api/npm", source="a test")
    assert registry.tarball_url("@corp/util", "1.2.3-rc.1") == (
        "https://packages.example/api/npm/@corp/util/-/util-1.2.3-rc.1.tgz"
    )
    assert registry.tarball_url("ms", "2.1.3") == "https://packages.example/api/npm/ms/-/ms-2.1.3.tgz"


def test_npm_settings_are_taken_from_the_environment_then_the_project_then_the_user_then_the_global_config(
    tmp_path: Path,
) -> None:
    project, home, prefix = tmp_path / "project", tmp_path / "home", tmp_path / "prefix"
    for directory in (project, home, prefix / "etc"):
        directory.mkdir(parents=True)
    (prefix / "etc" / "npmrc").write_text(
        "registry=http://global.test/\n@a:registry=http://global.test/a/\n@b:registry=http://global.test/b/\n"
        "@c:registry=http://global.test/c/\n@d:registry=http://global.test/d/\n"
    )
    (home / ".npmrc").write_text("@b:registry=http://user.test/b/\n@c:registry=http://user.test/c/\n"
                                 "@d:registry=http://user.test/d/\n")  # fmt: skip
    (project / ".npmrc").write_text("@c:registry=${MIRROR}/c/\n@d:registry='http://project.test/d/'\n")
    environ = {"HOME": str(home), "PATH": "", "PREFIX": str(prefix), "MIRROR": "http://project.test",
               "npm_config_@d:registry": "http://env.test/d/"}  # fmt: skip
    config = load_npm_config(project, environ)
    found = {name: config.registry_for(name) for name in ("x", "@a/x", "@b/x", "@c/x", "@d/x")}
    assert {name: (registry.url, registry.source) for name, registry in found.items()} == {
        "x": ("http://global.test", "`registry` in the global npmrc"),
        "@a/x": ("http://global.test/a", "`@a:registry` in the global npmrc"),
        "@b/x": ("http://user.test/b", "`@b:registry` in the user's npmrc"),
        "@c/x": ("http://project.test/c", "`@c:registry` in the project .npmrc"),
        "@d/x": ("http://env.test/d", "`@d:registry` in the environment"),
    }


def test_the_user_and_global_config_files_can_be_moved_as_in_npm(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.npmrc").write_text("@u:registry=http://user.test/\n")
    (tmp_path / "system.npmrc").write_text("registry=http://global.test/\n")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".npmrc").write_text("registry=http://ignored.test/\n")
    environ = {"HOME": str(tmp_path / "home"), "PATH": "", "NPM_CONFIG_USERCONFIG": str(tmp_path / "elsewhere.npmrc"),
               "npm_config_globalconfig": str(tmp_path / "system.npmrc")}  # fmt: skip
    config = load_npm_config(tmp_path, environ)
    assert config.registry_for("@u/x").url == "http://user.test"
    assert config.registry_for("x").url == "http://global.test"


def test_the_scope_setting_sends_unscoped_packages_to_that_scopes_registry(tmp_path: Path) -> None:
    (tmp_path / ".npmrc").write_text("scope=corp\n@corp:registry=http://corp.test/\nregistry=http://other.test/\n")
    config = load_npm_config(tmp_path, npm_environment(tmp_path))
    assert config.registry_for("ms").url == "http://corp.test"


def test_npmrc_text_is_read_as_npms_ini_parser_reads_it() -> None:
    text = (
        '# comment\n; comment\nregistry = http://a.test/ ; note\nquoted="http://b.test/#x"\n'
        "single='http://c.test/'\nescaped=a\\;b\\#c\nbare\nlist[]=1\nmissing=${NOT_SET}\nset=${SET}/x\n"
        "escaped-ref=\\${SET}\n[section]\nregistry=http://section.test/\n"
    )
    assert parse_npmrc(text, {"SET": "yes"}) == {
        "registry": "http://a.test/",
        "quoted": "http://b.test/#x",
        "single": "http://c.test/",
        "escaped": "a;b#c",
        "missing": "${NOT_SET}",
        "set": "yes/x",
        "escaped-ref": "${SET}",
    }
