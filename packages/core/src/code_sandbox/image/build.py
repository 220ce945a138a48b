"""The offline image build: a ``FROM scratch`` context written in memory, with the profile's runtime binary and its ELF
interpreter (root-owned and unreadable, mode 0711, and readable copies that gVisor runs), the seal
(:mod:`code_sandbox.image.seal`), the profile's files (helpers, any library tree; root-owned, 0444), the shared
libraries these need, an operator's package set if one is given (root-owned, read-only), ``/etc/passwd`` and
``/etc/group`` with the supervisor user, and empty mount points; the runtime's digests and a manifest of every entry go
into labels (:mod:`.layout`)."""

from __future__ import annotations

import hashlib
import io
import platform
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath

from code_sandbox.channel.protocol import PROTOCOL_LABEL, PROTOCOL_VERSION
from code_sandbox.engine import Engine, normalise_arch
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import READABLE_LOADER, SCRATCH_DIR, WORKSPACE_DIR, readable_runtime
from code_sandbox.image.elf import is_elf, resolve_runtime_files, with_interpreter
from code_sandbox.image.jail import JAIL_COUNTERS, JAIL_COUNTERS_DIR, JAIL_MODE, JAIL_PATH, JAIL_ROOT, jail_program
from code_sandbox.image.layout import (
    DOCKERFILE,
    FILE_MODE_IN_IMAGE,
    FILES_LABEL,
    GROUP,
    INIT_DIR,
    INIT_DIR_MODE,
    PASSWD,
    READABLE_DIGEST_LABEL,
    READABLE_RUNTIME_MODE,
    RUNTIME_DIGEST_LABEL,
    RUNTIME_MODE,
    image_gid,
    manifest_line,
    under,
)
from code_sandbox.image.package_sets import (
    DIRECTORY_MODE,
    FILE_MODE,
    is_package_name,
    set_labels,
)
from code_sandbox.image.seal import SEAL_PATH, seal_architectures, seal_library
from code_sandbox.profile import ImageContents, ImageSpec, PackageSet, Profile

Progress = Callable[[str], None]


def build_offline_image(
    engine: Engine,
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
    if info.interpreter is None:
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            "the runtime binary is statically linked",
            hint="pass --runtime with a dynamically linked Linux binary",
        )
    try:
        readable_bytes = with_interpreter(runtime_bytes, READABLE_LOADER)
    except ValueError:
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED, "the runtime binary's interpreter path is too short to name its readable copy"
        ) from None
    jail = jail_program(daemon.architecture)
    entries = _image_entries(runtime_bytes, readable_bytes, contents.runtime_path, info.interpreter, files, tree, jail)
    context = _build_context(entries)
    progress(f"sending {context.getbuffer().nbytes // (1024 * 1024)} MiB to the Docker engine")
    labels = {
        **spec.labels,
        spec.runtime_version_label: contents.runtime_version,
        PROTOCOL_LABEL: str(PROTOCOL_VERSION),
        RUNTIME_DIGEST_LABEL: hashlib.sha256(runtime_bytes).hexdigest(),
        READABLE_DIGEST_LABEL: hashlib.sha256(readable_bytes).hexdigest(),
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
    runtime: bytes,
    readable: bytes,
    runtime_path: str,
    interpreter: str,
    contents: Mapping[str, bytes],
    tree: Mapping[str, bytes],
    jail: bytes | None,
) -> dict[str, _Entry]:
    """Every entry of the image, all root-owned: files with their bytes, and the directories that hold them. Only the
    runtime and its interpreter are executable, and neither is readable; their readable copies are for gVisor, and so
    is the jail (root's alone, :mod:`code_sandbox.image.jail`) where one is written for the engine's architecture."""
    files: dict[str, tuple[bytes, int]] = {path: (data, FILE_MODE_IN_IMAGE) for path, data in contents.items()}
    files.update((path, (data, FILE_MODE)) for path, data in tree.items())
    files[runtime_path] = (runtime, RUNTIME_MODE)
    files[interpreter] = (contents[interpreter], RUNTIME_MODE)
    files[readable_runtime(runtime_path)] = (readable, READABLE_RUNTIME_MODE)
    files[READABLE_LOADER] = (contents[interpreter], READABLE_RUNTIME_MODE)
    if jail is not None:
        files[JAIL_PATH] = (jail, JAIL_MODE)
    files["/etc/passwd"] = (PASSWD.encode(), 0o444)
    files["/etc/group"] = (GROUP.encode(), 0o444)
    entries: dict[str, _Entry] = {
        WORKSPACE_DIR: ("directory", 0o700, b""),
        SCRATCH_DIR: ("directory", 0o700, b""),
        INIT_DIR: ("directory", INIT_DIR_MODE, b""),
    }
    if jail is not None:
        entries[JAIL_ROOT] = ("directory", 0o755, b"")
        entries[JAIL_COUNTERS_DIR] = ("directory", 0o700, b"")
        entries[JAIL_COUNTERS] = ("directory", 0o700, b"")
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
            _tar_entry("Dockerfile", tarfile.REGTYPE, 0o444, len(DOCKERFILE)), io.BytesIO(DOCKERFILE.encode())
        )
        for path in sorted(path for path, (kind, _, _) in entries.items() if kind == "directory"):
            context_dir = "init" if image_gid(path) else "rootfs"
            archive.addfile(_tar_entry(context_dir + path, tarfile.DIRTYPE, entries[path][1], 0))
        for path in sorted(path for path, (kind, _, _) in entries.items() if kind == "file"):
            _, mode, data = entries[path]
            archive.addfile(_tar_entry("rootfs" + path, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _manifest(entries: Mapping[str, _Entry], package_root: str | None) -> str:
    """The :data:`FILES_LABEL` of an image of these entries."""
    lines = (
        manifest_line(
            path, kind, mode, 0, image_gid(path), hashlib.sha256(data).hexdigest() if kind == "file" else None
        )
        for path, (kind, mode, data) in entries.items()
        if not under(path, package_root)
    )
    return "\n".join(sorted(lines))


def _tar_entry(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(name)
    entry.type = kind
    entry.mode = mode
    entry.size = size
    entry.uid = entry.gid = 0
    entry.uname = entry.gname = "root"
    entry.mtime = 0  # reproducible: the same inputs give the same context
    return entry
