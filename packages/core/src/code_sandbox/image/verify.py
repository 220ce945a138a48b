"""Verifying an image before anything runs on it: its labels (the helper protocol's version among them), user and whole
configuration as built, its exported tree against the build's manifest and what the host knows itself, the package
tree against its digest, and a hardened run; and the record of passes that later servers trust."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from code_sandbox.channel.protocol import PROTOCOL_LABEL, PROTOCOL_VERSION
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.engine import TRUST_MODELS, Engine, ExecRequest, FileEntry, ImageFacts
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    PROBE_UID,
    READABLE_RUNTIME_DIR,
    SUPERVISOR_USER,
    ContainerRequest,
    readable_runtime,
    user_of,
)
from code_sandbox.image.jail import JAIL_MODE, JAIL_PATH, jail_program
from code_sandbox.image.layout import (
    BUILDER_LABELS,
    ENGINE_MADE,
    FILE_MODE_IN_IMAGE,
    FILES_LABEL,
    FORBIDDEN_NAMES,
    GROUP,
    IMAGE_CONFIG,
    PASSWD,
    READABLE_DIGEST_LABEL,
    READABLE_RUNTIME_MODE,
    RUNTIME_DIGEST_LABEL,
    RUNTIME_MODE,
    image_gid,
    manifest_line,
    path_of,
    under,
)
from code_sandbox.image.package_sets import (
    DIRECTORY_MODE,
    FILE_MODE,
    PACKAGES_DIGEST_LABEL,
    PACKAGES_LABEL,
    packages_of,
    set_digest,
)
from code_sandbox.image.seal import SEAL_PATH, seal_library
from code_sandbox.liveness import is_private_directory
from code_sandbox.profile import ImageSpec, Profile

VERIFIER_VERSION = 6
"""Bump when :func:`verify_image` checks something new: passes recorded by an earlier version then no longer count."""


def verification_key(engine: Engine, profile: Profile, image_id: str) -> str:
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
        "engine": [engine.location, daemon.product, daemon.architecture, daemon.os_type,
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


def verify_image(engine: Engine, profile: Profile, *, apparmor: bool | None = None) -> VerifyReport:
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
    built = {spec.runtime_version_label, RUNTIME_DIGEST_LABEL, READABLE_DIGEST_LABEL, FILES_LABEL, PACKAGES_LABEL,
             PACKAGES_DIGEST_LABEL}  # fmt: skip
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
    differs = _config_differences(image, engine.image_annotations(image.id))
    report.add("config", not differs, "as built" if not differs else "not as built: " + ", ".join(differs))
    daemon = engine.daemon_facts()
    report.add("architecture", image.architecture == daemon.architecture, image.architecture)
    _verify_contents(engine, spec, image, report)
    _verify_run(engine, profile, image, apparmor=daemon.apparmor if apparmor is None else apparmor, report=report)
    return report


def _config_differences(image: ImageFacts, annotations: tuple[str, ...]) -> list[str]:
    """The parts of the image's configuration (its user and its annotations too) that are not what the build wrote."""
    names = {
        "env": "Env", "entrypoint": "Entrypoint", "cmd": "Cmd", "working_dir": "WorkingDir",
        "healthcheck": "Healthcheck", "volumes": "Volumes", "exposed_ports": "ExposedPorts", "on_build": "OnBuild",
        "stop_signal": "StopSignal", "shell": "Shell",
    }  # fmt: skip
    differs = [name for field_name, name in names.items()
               if getattr(image.config, field_name) != getattr(IMAGE_CONFIG, field_name)]  # fmt: skip
    if any(not entry.startswith(_DESCRIPTIVE_ANNOTATIONS) for entry in annotations):
        differs.append("Annotations")
    return [*differs, "User"] if image.user != SUPERVISOR_USER else differs


_DESCRIPTIVE_ANNOTATIONS = "org.opencontainers.image."
"""Annotations that only describe an image (Podman's builds add its base's digest); any other may be read by a runtime
(crun's ``run.oci.*``, runc's ``org.systemd.property.*``) and fails verification."""


def _verify_contents(engine: Engine, spec: ImageSpec, image: ImageFacts, report: VerifyReport) -> None:
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
    readable_path = readable_runtime(runtime_path)
    readable: tuple[str, int, int, str | None] | None = None
    seal = seal_library(image.architecture)
    seal_found = False
    jail = jail_program(image.architecture)
    jail_seen: tuple[str, int, int, str | None] | None = None
    runtime_digest: str | None = None
    tree = _TreeCheck(spec.package_root)
    seen: set[str] = set()
    engine_made: list[str] = []  # engine-made entries that are more than a mount point, an empty file or the link
    unsafe: list[str] = []  # not root's, setuid, setgid, sticky or writable by others: whatever the manifest says
    runnable: list[str] = []  # files others may both read and execute, outside the readable copies' directory
    accounts: dict[str, tuple[str, str | None]] = {}
    try:
        for entry in engine.export_filesystem(container_id):
            if tree.take(entry):
                continue
            if entry.path in ENGINE_MADE:
                if not _plain_engine_entry(entry):
                    engine_made.append(entry.path)
            else:
                if entry.uid != 0 or entry.gid != image_gid(entry.path) or entry.mode & _UNSAFE_BITS:
                    unsafe.append(entry.path)
                if _readable_executable(entry) and not under(entry.path, READABLE_RUNTIME_DIR):
                    runnable.append(entry.path)
                if entry.path in _ACCOUNTS:
                    accounts[entry.path] = (entry.kind, entry.sha256)
                seen.add(manifest_line(entry.path, entry.kind, entry.mode, entry.uid, entry.gid, entry.sha256,
                                        entry.link))  # fmt: skip
            if PurePosixPath(entry.path).name in forbidden_names:
                forbidden.add(entry.path)
            if entry.path in expected:
                helpers[entry.path] = (entry.sha256, entry.mode, entry.uid)
            if entry.path == runtime_path:
                runtime_found = entry.kind == "file" and entry.mode == RUNTIME_MODE and entry.uid == 0
                runtime_digest = entry.sha256
            if entry.path == readable_path:
                readable = (entry.kind, entry.mode, entry.uid, entry.sha256)
            if entry.path == JAIL_PATH:
                jail_seen = (entry.kind, entry.mode, entry.uid, entry.sha256)
            if entry.path == SEAL_PATH:
                seal_found = seal is not None and entry.sha256 == hashlib.sha256(seal).hexdigest()
                seal_found = seal_found and entry.kind == "file" and entry.mode == FILE_MODE_IN_IMAGE and entry.uid == 0
    finally:
        with contextlib.suppress(SandboxError):
            engine.remove_container(container_id)
    report.add(
        "no shell or package manager", not forbidden, "none found" if not forbidden else ", ".join(sorted(forbidden))
    )
    bad = sorted(path for path, digest in expected.items() if helpers.get(path) != (digest, FILE_MODE_IN_IMAGE, 0))
    report.add("helpers match the profile's", not bad, "all match" if not bad else "differ: " + ", ".join(bad))
    report.add("runtime sealed", runtime_found, f"{runtime_path} root-owned, mode {RUNTIME_MODE:o}")
    digest_label = image.labels.get(RUNTIME_DIGEST_LABEL)
    report.add(
        "runtime digest",
        runtime_digest == digest_label is not None,
        f"{runtime_path} is the binary the build recorded" if runtime_digest == digest_label is not None
        else f"{runtime_path} is not the binary the build recorded in {RUNTIME_DIGEST_LABEL}",
    )  # fmt: skip
    readable_label = image.labels.get(READABLE_DIGEST_LABEL)
    readable_ok = readable == ("file", READABLE_RUNTIME_MODE, 0, readable_label) and readable_label is not None
    report.add(
        "readable runtime",
        readable_ok,
        f"{readable_path} is the recorded copy, root-owned, mode {READABLE_RUNTIME_MODE:o}" if readable_ok
        else f"{readable_path} is missing, or not the recorded copy, root-owned, mode {READABLE_RUNTIME_MODE:o}",
    )  # fmt: skip
    report.add(
        "nothing readable runs",
        not runnable,
        f"every executable file is unreadable, but under {READABLE_RUNTIME_DIR}"
        if not runnable
        else "readable and executable: " + ", ".join(sorted(runnable)[:5]),
    )
    report.add("seal", seal_found, f"{SEAL_PATH} " + ("matches" if seal_found else "is missing or differs"))
    _report_jail(jail, jail_seen, report)
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


def _report_jail(jail: bytes | None, seen: tuple[str, int, int, str | None] | None, report: VerifyReport) -> None:
    """The jail is exactly ours, root's alone, where one is written for the image's architecture; absent otherwise."""
    if jail is None:
        report.add("jail", seen is None, "none for this architecture" if seen is None else f"{JAIL_PATH} is not ours")
        return
    matches = seen == ("file", JAIL_MODE, 0, hashlib.sha256(jail).hexdigest())
    report.add(
        "jail",
        matches,
        f"{JAIL_PATH} matches, root-owned, mode {JAIL_MODE:o}" if matches else f"{JAIL_PATH} is missing or differs",
    )


def _plain_engine_entry(entry: FileEntry) -> bool:
    if entry.kind == "directory":
        return True
    if entry.kind == "file":
        return entry.sha256 == _EMPTY_SHA256
    return entry.path == "/etc/mtab" and entry.kind == "symlink" and entry.link in ("/proc/mounts", "../proc/mounts")


def _readable_executable(entry: FileEntry) -> bool:
    """A file every uid may both read and execute: a process that runs it is dumpable (SECURITY.md)."""
    return entry.kind == "file" and entry.mode & 0o005 == 0o005


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNSAFE_BITS = 0o7002
_ACCOUNTS = {"/etc/passwd": PASSWD.encode(), "/etc/group": GROUP.encode()}
"""Known to the host byte for byte, whatever an image's labels say: a name for a sandbox uid, or one more member of
group 0 or 65533, would give its processes groups they must not have."""


def _report_files(image: ImageFacts, seen: set[str], engine_made: list[str], report: VerifyReport) -> None:
    """The exported tree (outside the package tree and the engine's own entries) against the build's manifest."""
    manifest = image.labels.get(FILES_LABEL)
    if not manifest:
        report.add("files", False, f"no {FILES_LABEL} label: not an image this version built")
        return
    built = set(manifest.split("\n"))
    odd = sorted({*map(path_of, seen ^ built), *engine_made})
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


def _probe_labels(engine: Engine) -> dict[str, str]:
    """Probe containers are managed and due within a minute, so a sweep removes any that a crash left behind."""
    return {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: str(int(engine.now()) + 60)}


def _verify_run(engine: Engine, profile: Profile, image: ImageFacts, *, apparmor: bool, report: VerifyReport) -> None:
    spec = profile.image_spec()
    try:
        runtime = engine.runtime_in_force()
    except SandboxError as exc:
        report.add("hardened run", False, f"not run: {exc.message}")
        return
    model = runtime.trust_model(jailed_runs=profile.info.jailed_runs, architecture=image.architecture)
    report.add("trust model", True, TRUST_MODELS[model])
    watchdog = runtime_argv(engine, profile, [*profile.helper_argv("watchdog"), "60"])
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
            ExecRequest(
                runtime_argv(engine, profile, spec.runtime_version_argv),
                user=user_of(PROBE_UID),
                timeout=30,
                max_stdout=4096,
                repeatable=True,
            ),
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
