"""Build the sandbox image offline and verify an image before anything runs on it.

The offline build writes a ``FROM scratch`` context in memory: the profile's runtime binary (root-owned and
unreadable, mode 0711), the seal (:mod:`code_sandbox.seal`), the profile's files (helpers, any library tree;
root-owned, 0555), the shared libraries these need, an operator's package set if one is given (root-owned, read-only),
``/etc/passwd`` and ``/etc/group`` with the supervisor user, and empty mount points. Verification checks labels
(including the helper protocol's version), user, contents (the package tree against its digest) and a real run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import re
import stat
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from code_sandbox.elf import is_elf, resolve_runtime_files
from code_sandbox.engine import DockerEngine, FileEntry, ImageConfig, ImageFacts, normalise_arch
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import (
    ENVIRONMENT,
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    LABEL_PREFIX,
    PROBE_UID,
    SCRATCH_DIR,
    SUPERVISOR_UID,
    SUPERVISOR_USER,
    WORKSPACE_DIR,
    ContainerRequest,
    user_of,
)
from code_sandbox.liveness import is_private_directory
from code_sandbox.package_sets import (
    DIRECTORY_MODE,
    FILE_MODE,
    PACKAGES_DIGEST_LABEL,
    PACKAGES_LABEL,
    is_package_name,
    packages_of,
    set_digest,
    set_labels,
)
from code_sandbox.profile import ImageContents, ImageSpec, PackageSet, Profile
from code_sandbox.protocol import PROTOCOL_LABEL, PROTOCOL_VERSION
from code_sandbox.seal import SEAL_PATH, seal_architectures, seal_library

Progress = Callable[[str], None]

# Names that must not exist anywhere in the image: shells, system package managers and privilege tools. A profile
# adds its runtime's own package managers (ImageSpec.forbidden_names).
FORBIDDEN_NAMES = frozenset(
    {"sh", "bash", "dash", "ash", "zsh", "ksh", "csh", "busybox", "apt", "apt-get", "dpkg", "apk", "rpm", "yum",
     "dnf", "su", "sudo", "doas", "env"}
)  # fmt: skip

_PASSWD = (
    "root:x:0:0:root:/nonexistent:/nonexistent\n"
    f"supervisor:x:{SUPERVISOR_UID}:{SUPERVISOR_UID}:supervisor:/nonexistent:/nonexistent\n"
)
_GROUP = f"root:x:0:\nsupervisor:x:{SUPERVISOR_UID}:\n"
RUNTIME_MODE = 0o711
"""Root-owned and unreadable: the kernel then makes every process that execs the runtime non-dumpable from its first
instruction, so code in a sandbox cannot open another process's ``/proc/<pid>/fd`` or ``mem``, nor ptrace it, even
under its own uid. The seal (:mod:`code_sandbox.seal`) is a second layer. gVisor cannot execute such a binary (it
needs read permission to load it), so these images do not run under runsc yet (SECURITY.md, "Under gVisor")."""
IMAGE_PATH = ENVIRONMENT["PATH"]
IMAGE_CONFIG = ImageConfig(env=(f"PATH={IMAGE_PATH}",), working_dir=WORKSPACE_DIR)
"""The image's whole configuration as the build writes it (and its user, :data:`SUPERVISOR_USER`): no entrypoint,
command, health check, volume, port, ``ONBUILD``, stop signal or shell, and no variable but ``PATH``."""
_DOCKERFILE = f"FROM scratch\nCOPY rootfs/ /\nUSER {SUPERVISOR_USER}\nENV PATH={IMAGE_PATH}\nWORKDIR {WORKSPACE_DIR}\n"
BUILDER_LABELS = frozenset({"io.buildah.version"})
"""Labels an engine's builder adds to every image it builds (Podman's: the buildah version), which say nothing about
how a container starts."""
RUNTIME_DIGEST_LABEL = LABEL_PREFIX + "runtime.sha256"
"""The sha256 of the runtime binary the build put in the image."""
FILES_LABEL = LABEL_PREFIX + "files"
"""The build's manifest: one line per entry of the image outside the package tree (which its own labels cover), as
``kind mode uid:gid sha256 path``, sorted. ``verify-image`` compares the exported tree with it: nothing extra, nothing
changed."""
ENGINE_MADE = frozenset(
    {"/.dockerenv", "/dev", "/dev/console", "/dev/pts", "/dev/shm", "/etc/hostname", "/etc/hosts",  # noqa: S108
     "/etc/mtab", "/etc/resolv.conf", "/proc", "/sys", "/run", "/run/.containerenv", "/var", "/var/tmp"}  # noqa: S108
)  # fmt: skip
"""Entries that Docker or Podman put in every container's tree (mount points, empty files it later mounts over, the
``/etc/mtab`` link): in an export, each must be a directory, an empty file or that link, and nothing more."""


def build_offline_image(
    engine: DockerEngine,
    profile: Profile,
    *,
    runtime: Path | None,
    progress: Progress,
    packages: PackageSet | None = None,
) -> str:
    """Build the profile's image without any registry and tag it with the profile's single allowlisted tag.

    :param runtime: an operator-supplied runtime binary, or ``None`` for the profile's pinned one.
    :param packages: a checked package set to vendor (:meth:`Profile.package_set`), or ``None`` for none.
    :return: the new image's immutable ``sha256:`` ID.
    """
    daemon = engine.daemon_facts()
    if daemon.os_type != "linux":
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            "the Docker engine does not run Linux containers",
            hint="switch Docker Desktop to Linux containers",
        )
    here = normalise_arch(platform.machine().lower())
    if here != daemon.architecture:  # the image's libraries are this machine's
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            f"the Docker engine runs {daemon.architecture} but this machine is {here}",
            hint="run build-image on a Linux machine of the engine's architecture (it may be the engine's host)",
        )
    progress("collecting the runtime and helpers")
    contents = profile.image_contents(runtime)
    spec = profile.image_spec()
    if packages is not None and spec.package_root is None:
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"the {profile.name} profile has no package sets")
    files = _read_files(contents)
    modules = [source for path, source in contents.files.items() if isinstance(source, Path) and is_elf(files[path])]
    info, libraries = resolve_runtime_files(contents.runtime_source, modules)
    if info.machine != daemon.architecture:
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            f"the runtime binary is for {info.machine} but the Docker engine runs {daemon.architecture}",
            hint="pass --runtime with a Linux binary for the Docker daemon's architecture",
        )
    progress("checking the runtime binary's digest")
    runtime_bytes = contents.runtime_source.read_bytes()
    if contents.runtime_sha256 is not None and hashlib.sha256(runtime_bytes).hexdigest() != contents.runtime_sha256:
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            "the pinned runtime binary does not match its recorded sha256",
            hint=contents.reinstall_hint,
        )
    for image_path, host_path in libraries.items():
        files.setdefault(image_path, host_path.read_bytes())
    files[SEAL_PATH] = _seal_for(daemon.architecture)
    tree = _package_tree(spec, packages)
    progress(f"writing the context ({len(files)} files, {len(libraries)} of them libraries; {len(tree)} vendored)")
    entries = _image_entries(runtime_bytes, contents.runtime_path, files, tree)
    context = _build_context(entries)
    progress(f"sending {context.getbuffer().nbytes // (1024 * 1024)} MiB to the Docker engine")
    labels = {
        **spec.labels,
        spec.runtime_version_label: contents.runtime_version,
        PROTOCOL_LABEL: str(PROTOCOL_VERSION),
        RUNTIME_DIGEST_LABEL: hashlib.sha256(runtime_bytes).hexdigest(),
        FILES_LABEL: _manifest(entries, spec.package_root),
        **(set_labels(packages.packages, packages.files) if packages is not None else {}),
    }
    image_id = engine.build_image(context, tag=spec.tag, labels=labels, on_step=progress)
    progress(f"built {spec.tag}")
    return image_id


def _seal_for(architecture: str) -> bytes:
    seal = seal_library(architecture)
    if seal is None:
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            f"sandbox images can be built for {' and '.join(seal_architectures())} engines only",
        )
    return seal


def _read_files(contents: ImageContents) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for image_path, source in contents.files.items():
        if not image_path.startswith("/") or ".." in PurePosixPath(image_path).parts:
            raise SandboxError(ErrorCode.PROFILE_ERROR, "the profile put a file outside the image's root")
        try:
            files[image_path] = source.read_bytes() if isinstance(source, Path) else bytes(source)
        except OSError:
            raise SandboxError(
                ErrorCode.IMAGE_BUILD_FAILED, "a file the runtime needs cannot be read", hint=contents.reinstall_hint
            ) from None
    return files


def _package_tree(spec: ImageSpec, packages: PackageSet | None) -> dict[str, bytes]:
    """The package set's files at their image paths; each relative path is checked again here."""
    if packages is None or spec.package_root is None:
        return {}
    listed = packages.packages
    if not listed or listed != tuple(sorted(set(listed))) or not all(map(is_package_name, listed)):
        raise SandboxError(ErrorCode.PROFILE_ERROR, "the profile's package list is empty, unsorted or malformed")
    tree: dict[str, bytes] = {}
    for relative, data in packages.files.items():
        if any(part in ("", ".", "..") for part in relative.split("/")):  # an absolute path starts with ""
            raise SandboxError(ErrorCode.PROFILE_ERROR, "the profile put a package file outside the package tree")
        tree[f"{spec.package_root}/{relative}"] = data
    return tree


_Entry = tuple[str, int, bytes]  # kind ("directory" or "file"), mode, a file's bytes (a directory's are empty)


def _image_entries(
    runtime: bytes, runtime_path: str, contents: Mapping[str, bytes], tree: Mapping[str, bytes]
) -> dict[str, _Entry]:
    """Every entry of the image, all root-owned: files with their bytes, and the directories that hold them."""
    files: dict[str, tuple[bytes, int]] = {path: (data, 0o555) for path, data in contents.items()}
    files.update((path, (data, FILE_MODE)) for path, data in tree.items())
    files[runtime_path] = (runtime, RUNTIME_MODE)
    files["/etc/passwd"] = (_PASSWD.encode(), 0o444)
    files["/etc/group"] = (_GROUP.encode(), 0o444)
    entries: dict[str, _Entry] = {WORKSPACE_DIR: ("directory", 0o700, b""), SCRATCH_DIR: ("directory", 0o700, b"")}
    for image_path in files:
        mode = DIRECTORY_MODE if image_path in tree else 0o755
        for parent in PurePosixPath(image_path).parents:
            if str(parent) != "/":
                entries.setdefault(str(parent), ("directory", mode, b""))
    entries.update((path, ("file", mode, data)) for path, (data, mode) in files.items())
    return entries


def _build_context(entries: Mapping[str, _Entry]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(
            _tar_entry("Dockerfile", tarfile.REGTYPE, 0o444, len(_DOCKERFILE)), io.BytesIO(_DOCKERFILE.encode())
        )
        for path in sorted(path for path, (kind, _, _) in entries.items() if kind == "directory"):
            archive.addfile(_tar_entry("rootfs" + path, tarfile.DIRTYPE, entries[path][1], 0))
        for path in sorted(path for path, (kind, _, _) in entries.items() if kind == "file"):
            _, mode, data = entries[path]
            archive.addfile(_tar_entry("rootfs" + path, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _manifest(entries: Mapping[str, _Entry], package_root: str | None) -> str:
    """The :data:`FILES_LABEL` of an image of these entries."""
    lines = (
        _manifest_line(path, kind, mode, 0, 0, hashlib.sha256(data).hexdigest() if kind == "file" else None)
        for path, (kind, mode, data) in entries.items()
        if not _under(path, package_root)
    )
    return "\n".join(sorted(lines))


def _manifest_line(path: str, kind: str, mode: int, uid: int, gid: int, sha256: str | None, link: str = "") -> str:
    line = f"{kind} {mode:04o} {uid}:{gid} {sha256 or '-'} {path}"
    return f"{line} -> {link}" if link else line


def _path_of(line: str) -> str:
    return line.split(" ", 4)[-1].split(" -> ")[0]


def _under(path: str, root: str | None) -> bool:
    return root is not None and (path == root or path.startswith(root + "/"))


def _tar_entry(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = kind
    entry.mode = mode
    entry.size = size
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = "root"
    entry.mtime = 0  # reproducible: the same inputs give the same context
    return entry


VERIFIER_VERSION = 4
"""Bump when :func:`verify_image` checks something new: passes recorded by an earlier version then no longer count."""


def verification_key(engine: DockerEngine, profile: Profile, image_id: str) -> str:
    """What a pass of :func:`verify_image` vouches for: this image ID (a hash of its content) checked against this
    profile's expectations, by this version of the checks, on an engine like this one (the hardened run is the
    engine's)."""
    spec = profile.image_spec()
    daemon = engine.daemon_facts()
    material = {
        "verifier": VERIFIER_VERSION,
        "protocol": PROTOCOL_VERSION,
        "image": image_id,
        "profile": profile.name,
        "labels": sorted(spec.labels.items()),
        "helpers": sorted(spec.helper_digests.items()),
        "runtime": [spec.runtime_path, spec.runtime_version_label, *spec.runtime_version_argv],
        "forbidden": sorted(spec.forbidden_names),
        "engine": [engine.address.shown(), daemon.product, daemon.architecture, daemon.os_type,
                   daemon.apparmor, daemon.seccomp, engine.runtime_in_force().name],
    }  # fmt: skip
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


class VerifiedImages:
    """Verification passes that outlive a server process: one empty file per :func:`verification_key`, in a private
    directory of the state directory. Only files this user owns, in a directory of this user that nobody else can
    write, count; anything odd counts as "not verified"."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __contains__(self, key: str) -> bool:
        try:
            directory, entry = self.directory.lstat(), (self.directory / key).lstat()
        except OSError:
            return False
        return is_private_directory(directory) and stat.S_ISREG(entry.st_mode) and entry.st_uid == os.geteuid()

    def add(self, key: str) -> None:
        """Record a pass; a failure to record only means the next server verifies again."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
            os.close(os.open(self.directory / key, flags, 0o600))
        except OSError:
            return


@dataclass
class Check:
    """One line of the verification table."""

    name: str
    passed: bool
    detail: str


@dataclass
class VerifyReport:
    """The outcome of :func:`verify_image`. ``image`` is set when the tag resolved."""

    checks: list[Check] = field(default_factory=list[Check])
    image: ImageFacts | None = None
    runtime_version: str | None = None
    packages: tuple[str, ...] = ()
    """The vendored packages the image's labels state (checked against the tree when the report passed)."""
    start_error: SandboxError | None = None
    """Why a hardened container of the image could not start, when it could not."""

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    @property
    def engine_fault(self) -> SandboxError | None:
        """:attr:`start_error` when it is all that failed: a sound image that no container can run from is the
        engine's fault, not the image's, and what a server tells its client instead of an invalid image."""
        if self.start_error is None or self.image is None:
            return None
        return self.start_error if all(check.passed for check in self.checks if check.name != "hardened run") else None

    def add(self, name: str, passed: bool, detail: str) -> bool:
        self.checks.append(Check(name, passed, detail))
        return passed


def verify_image(engine: DockerEngine, profile: Profile, *, apparmor: bool | None = None) -> VerifyReport:
    """Check the profile's image: immutable ID, exact labels, non-root user, contents, and a hardened run."""
    spec = profile.image_spec()
    report = VerifyReport()
    image = engine.image_facts(spec.tag)
    if image is None:
        report.add("image present", False, f"{spec.tag} not found (images are never pulled)")
        return report
    report.add("image present", True, f"{spec.tag} = {image.id[:19]}, {image.size // (1024 * 1024)} MiB")
    report.image = image
    expected = {**spec.labels, PROTOCOL_LABEL: str(PROTOCOL_VERSION)}
    wrong = sorted(key for key, value in expected.items() if image.labels.get(key) != value)
    built = {spec.runtime_version_label, RUNTIME_DIGEST_LABEL, FILES_LABEL, PACKAGES_LABEL, PACKAGES_DIGEST_LABEL}
    unexpected = sorted(image.labels.keys() - expected.keys() - built - BUILDER_LABELS)
    report.add(
        "labels",
        not wrong and not unexpected,
        "all match" if not (wrong or unexpected) else
        "; ".join([*(["wrong or missing: " + ", ".join(wrong)] if wrong else []),
                   *(["not the build's: " + ", ".join(unexpected)] if unexpected else [])]),
    )  # fmt: skip
    user_ok = image.user not in ("", "0", "root") and not image.user.startswith(("0:", "root:"))
    report.add("non-root user", user_ok, image.user or "none set")
    differs = _config_differences(image)
    report.add("config", not differs, "as built" if not differs else "not as built: " + ", ".join(differs))
    daemon = engine.daemon_facts()
    report.add("architecture", image.architecture == daemon.architecture, image.architecture)
    _verify_contents(engine, spec, image, report)
    _verify_run(engine, profile, image, apparmor=daemon.apparmor if apparmor is None else apparmor, report=report)
    return report


def _config_differences(image: ImageFacts) -> list[str]:
    """The parts of the image's configuration (and its user) that are not what the build wrote."""
    names = {
        "env": "Env", "entrypoint": "Entrypoint", "cmd": "Cmd", "working_dir": "WorkingDir",
        "healthcheck": "Healthcheck", "volumes": "Volumes", "exposed_ports": "ExposedPorts", "on_build": "OnBuild",
        "stop_signal": "StopSignal", "shell": "Shell",
    }  # fmt: skip
    differs = [name for field_name, name in names.items()
               if getattr(image.config, field_name) != getattr(IMAGE_CONFIG, field_name)]  # fmt: skip
    if any(not entry.startswith(_DESCRIPTIVE_ANNOTATIONS) for entry in image.config.annotations):
        differs.append("Annotations")
    return [*differs, "User"] if image.user != SUPERVISOR_USER else differs


_DESCRIPTIVE_ANNOTATIONS = "org.opencontainers.image."
"""Annotations that only describe an image (Podman's builds add its base's digest); any other may be read by a runtime
(crun's ``run.oci.*``, runc's ``org.systemd.property.*``) and fails verification."""


def _verify_contents(engine: DockerEngine, spec: ImageSpec, image: ImageFacts, report: VerifyReport) -> None:
    expected, runtime_path = spec.helper_digests, spec.runtime_path
    forbidden_names = FORBIDDEN_NAMES | spec.forbidden_names
    request = ContainerRequest(
        image_id=image.id, command=["/nonexistent"], labels=_probe_labels(engine), apparmor=False,
        image_environment=image.config.env_names,
    )  # fmt: skip
    container_id = engine.create_container(request, start=False)
    forbidden: set[str] = set()
    helpers: dict[str, tuple[str | None, int, int]] = {}
    runtime_found = False
    seal = seal_library(image.architecture)
    seal_found = False
    runtime_digest: str | None = None
    tree = _TreeCheck(spec.package_root)
    seen: set[str] = set()
    engine_made: list[str] = []  # engine-made entries that are more than a mount point, an empty file or the link
    unsafe: list[str] = []  # not root's, setuid, setgid, sticky or writable by others: whatever the manifest says
    accounts: dict[str, tuple[str, str | None]] = {}
    try:
        for entry in engine.export_filesystem(container_id):
            if tree.take(entry):
                continue
            if entry.path in ENGINE_MADE:
                if not _plain_engine_entry(entry):
                    engine_made.append(entry.path)
            else:
                if entry.uid != 0 or entry.gid != 0 or entry.mode & _UNSAFE_BITS:
                    unsafe.append(entry.path)
                if entry.path in _ACCOUNTS:
                    accounts[entry.path] = (entry.kind, entry.sha256)
                seen.add(_manifest_line(entry.path, entry.kind, entry.mode, entry.uid, entry.gid, entry.sha256,
                                        entry.link))  # fmt: skip
            if PurePosixPath(entry.path).name in forbidden_names:
                forbidden.add(entry.path)
            if entry.path in expected:
                helpers[entry.path] = (entry.sha256, entry.mode, entry.uid)
            if entry.path == runtime_path:
                runtime_found = entry.kind == "file" and entry.mode == RUNTIME_MODE and entry.uid == 0
                runtime_digest = entry.sha256
            if entry.path == SEAL_PATH:
                seal_found = seal is not None and entry.sha256 == hashlib.sha256(seal).hexdigest()
                seal_found = seal_found and entry.kind == "file" and entry.mode == 0o555 and entry.uid == 0
    finally:
        with contextlib.suppress(SandboxError):
            engine.remove_container(container_id)
    report.add(
        "no shell or package manager", not forbidden, "none found" if not forbidden else ", ".join(sorted(forbidden))
    )
    bad = sorted(path for path, digest in expected.items() if helpers.get(path) != (digest, 0o555, 0))
    report.add("helpers match the profile's", not bad, "all match" if not bad else "differ: " + ", ".join(bad))
    report.add("runtime sealed", runtime_found, f"{runtime_path} root-owned, mode {RUNTIME_MODE:o}")
    digest_label = image.labels.get(RUNTIME_DIGEST_LABEL)
    report.add(
        "runtime digest",
        runtime_digest == digest_label is not None,
        f"{runtime_path} is the binary the build recorded" if runtime_digest == digest_label is not None
        else f"{runtime_path} is not the binary the build recorded in {RUNTIME_DIGEST_LABEL}",
    )  # fmt: skip
    report.add("seal", seal_found, f"{SEAL_PATH} " + ("matches" if seal_found else "is missing or differs"))
    _report_files(image, seen, engine_made, report)
    report.add(
        "owners and modes",
        not unsafe,
        "all root's, none setuid, setgid or writable by others" if not unsafe else ", ".join(sorted(unsafe)[:5]),
    )
    wrong_accounts = sorted(path for path, data in _ACCOUNTS.items()
                            if accounts.get(path) != ("file", hashlib.sha256(data).hexdigest()))  # fmt: skip
    report.add(
        "users and groups",
        not wrong_accounts,
        "as the build writes them" if not wrong_accounts else "differ: " + ", ".join(wrong_accounts),
    )
    tree.report(image, report)


def _plain_engine_entry(entry: FileEntry) -> bool:
    if entry.kind == "directory":
        return True
    if entry.kind == "file":
        return entry.sha256 == _EMPTY_SHA256
    return entry.path == "/etc/mtab" and entry.kind == "symlink" and entry.link in ("/proc/mounts", "../proc/mounts")


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNSAFE_BITS = 0o7002
_ACCOUNTS = {"/etc/passwd": _PASSWD.encode(), "/etc/group": _GROUP.encode()}
"""Known to the host byte for byte, whatever an image's labels say: a name for a sandbox uid, or one more member of
group 0 or 65533, would give its processes groups they must not have."""


def _report_files(image: ImageFacts, seen: set[str], engine_made: list[str], report: VerifyReport) -> None:
    """The exported tree (outside the package tree and the engine's own entries) against the build's manifest."""
    manifest = image.labels.get(FILES_LABEL)
    if not manifest:
        report.add("files", False, f"no {FILES_LABEL} label: not an image this version built")
        return
    built = set(manifest.split("\n"))
    odd = sorted({*map(_path_of, seen ^ built), *engine_made})
    report.add(
        "files",
        not odd,
        f"all {len(built)} entries as built"
        if not odd
        else "added, changed or missing: " + ", ".join(odd[:5]) + (f" and {len(odd) - 5} more" if len(odd) > 5 else ""),
    )


class _TreeCheck:
    """Collects the package tree from an export and checks it against the image's package labels."""

    def __init__(self, root: str | None) -> None:
        self.root = root
        self.found = False
        self.files: list[tuple[str, str]] = []
        self.directories: set[str] = set()
        self.odd: list[str] = []  # not a root-owned read-only file or directory

    def take(self, entry: FileEntry) -> bool:
        """Take ``entry`` if it is in the package tree (the root included)."""
        if self.root is None or (entry.path != self.root and not entry.path.startswith(self.root + "/")):
            return False
        self.found = True
        relative = entry.path.removeprefix(self.root).lstrip("/")
        if entry.kind == "file" and entry.uid == 0 and entry.mode == FILE_MODE and entry.sha256 is not None:
            self.files.append((relative, entry.sha256))
        elif entry.kind == "directory" and entry.uid == 0 and entry.mode == DIRECTORY_MODE:
            self.directories.add(relative)
        else:
            self.odd.append(entry.path)
        return True

    def _unneeded(self) -> list[str]:
        """Entries no vendored file accounts for: odd ones, and directories that no file needs (added to the tree)."""
        needed = {"", *(str(parent) for path, _ in self.files for parent in PurePosixPath(path).parents)} - {"."}
        return [*self.odd, *(f"{self.root}/{path}" for path in self.directories - needed)]

    def report(self, image: ImageFacts, report: VerifyReport) -> None:
        packages = packages_of(image.labels)
        if packages is None:
            report.add("package set", False, f"malformed {PACKAGES_LABEL} or {PACKAGES_DIGEST_LABEL} labels")
        elif not packages:
            report.add("package set", not self.found, "none" if not self.found else "a package tree with no labels")
        elif self.root is None:
            report.add("package set", False, "labelled with packages, but the profile vendors none")
        elif unneeded := self._unneeded():
            report.add("package set", False, "not a read-only file of the set: " + ", ".join(sorted(unneeded)[:5]))
        elif set_digest(packages, self.files) != image.labels[PACKAGES_DIGEST_LABEL]:
            report.add("package set", False, f"the tree under {self.root} differs from its digest")
        else:
            report.packages = packages
            report.add("package set", True, f"{len(packages)} packages; the tree under {self.root} matches")


_VERSION_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")


def _probe_labels(engine: DockerEngine) -> dict[str, str]:
    """Probe containers are managed and due within a minute, so a sweep removes any that a crash left behind."""
    return {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: str(int(engine.now()) + 60)}


def _verify_run(
    engine: DockerEngine, profile: Profile, image: ImageFacts, *, apparmor: bool, report: VerifyReport
) -> None:
    spec = profile.image_spec()
    watchdog = [*profile.helper_argv("watchdog"), "60"]
    request = ContainerRequest(
        image_id=image.id, command=watchdog, labels=_probe_labels(engine), apparmor=apparmor,
        image_environment=image.config.env_names,
    )  # fmt: skip
    try:
        container_id = engine.create_container(request)
    except SandboxError as exc:  # an operator's surface: the engine's own words and the fix are shown
        report.start_error = exc
        fix = f" (fix: {exc.hint})" if exc.hint else ""
        report.add("hardened run", False, f"a hardened container could not start: {exc.for_operator()}{fix}")
        return
    try:
        result = engine.exec(
            container_id,
            list(spec.runtime_version_argv),
            user=user_of(PROBE_UID),
            timeout=30,
            max_stdout=4096,
            repeatable=True,
        )
    except SandboxError as exc:
        report.add("hardened run", False, f"the runtime did not run ({exc.code})")
        return
    finally:
        with contextlib.suppress(SandboxError):
            engine.remove_container(container_id)
    version = result.stdout.decode("ascii", "replace").strip()
    if not _VERSION_TEXT.fullmatch(version):  # e.g. the engine's words on a stopped container: never shown
        version = "something other than a version"
    report.runtime_version = version
    label = image.labels.get(spec.runtime_version_label)
    ok = result.exit_code == 0 and version == label
    report.add(
        "hardened run",
        ok,
        f"{spec.runtime_path} prints {version or 'nothing'}" + ("" if ok else f" (label says {label})"),
    )
