"""The profile API: what a runtime profile is, as core sees it.

A profile is an object of a :class:`Profile` subclass that a plugin registers (:mod:`code_sandbox.hookspecs`).
Everything core knows about a runtime (its name, tools, image, argv, helpers, probe) it learns by asking that
object; core itself names no runtime. ``docs/profiles.md`` describes how to write one.
"""

from __future__ import annotations

import abc
import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from code_sandbox.errors import ErrorCode, SandboxError

HelperKind = Literal["watchdog", "files", "runner"]
"""The three in-container helpers: the lifetime watchdog, the file helper and the runner."""
WATCHDOG_LIFELINE = "--lifeline"
"""The watchdog's first argument when the server holds the container's stdin: it must exit when its stdin ends."""


@dataclass(frozen=True)
class ProfileInfo:
    """Who a profile is and how it looks to a client.

    :param name: the profile's name, e.g. ``lua-offline``; ``CODE_SANDBOX_PROFILE`` selects by it.
    :param language: the language's display name, e.g. ``Lua``.
    :param run_tool_name: the MCP tool that runs an entrypoint, e.g. ``run_lua``.
    :param run_tool_description: that tool's description, written for a model. Limits are placeholders that core
        fills in (``{memory}``, ``{cpus}``, ``{processes}``, ``{output_cap}``, ...: :data:`code_sandbox.limits.WORDS`),
        so the text says what is enforced; a literal brace is doubled.
    :param execute_tool_name: the one-shot MCP tool (fresh sandbox, write, run, destroy).
    :param entrypoint_suffixes: the file suffixes an entrypoint may have, e.g. ``(".lua",)``.
    :param default_entrypoints: what ``code-sandbox run FOLDER`` runs when not told, first match wins.
    :param example_path: a workspace path shown in tool text and schemas, e.g. ``src/app.lua``.
    :param ignored_directories: folder names ``code-sandbox run`` does not copy (dependency caches).
    :param runtime_description: what ``build-image --runtime`` takes, e.g. ``a Linux lua binary``.
    :param protocol_version: the version of the host/helper protocol (:mod:`code_sandbox.channel.protocol`) its helpers
        speak; core serves a profile only when it equals its own ``PROTOCOL_VERSION``.
    :param evaluate_tool_name: the MCP tool that evaluates code in a session's persistent context (its runner
        implements the protocol's ``evaluate``), e.g. ``evaluate_lua``; ``None`` when the profile has none.
    :param evaluate_tool_description: that tool's text, with the same placeholders as ``run_tool_description``.
    :param jailed_runs: whether its runner can serve the channel jailed under gVisor (``runner --channel --jailed``:
        root in gVisor's kernel, starting every program through :data:`~code_sandbox.image.jail.JAIL_PATH`); without it
        gVisor's sandboxes keep the engine-only model (SECURITY.md).
    """

    name: str
    language: str
    run_tool_name: str
    run_tool_description: str
    execute_tool_name: str
    entrypoint_suffixes: tuple[str, ...]
    default_entrypoints: tuple[str, ...]
    example_path: str
    runtime_description: str
    protocol_version: int
    ignored_directories: frozenset[str] = frozenset()
    evaluate_tool_name: str | None = None
    evaluate_tool_description: str = ""
    jailed_runs: bool = False


@dataclass(frozen=True)
class ImageSpec:
    """The single image a profile allows, and how to check it.

    :param tag: the one allowlisted tag; the server resolves it to an immutable ``sha256:`` ID and never pulls.
    :param labels: every label the image must carry, with its exact value (core adds the protocol label).
    :param helper_digests: in-image path of each helper -> the sha256 hex digest its file must have.
    :param runtime_path: in-image path of the runtime binary.
    :param runtime_version_label: the label whose value must equal what ``runtime_version_argv`` prints.
    :param runtime_version_argv: argv that prints the runtime's version inside a hardened container.
    :param forbidden_names: file names that must not exist anywhere in the image, besides core's (shells,
        system package managers, privilege tools): the runtime's own package managers, say. The package tree is
        exempt: nothing in it can be executed (files 0444, directories 0555, all root-owned).
    :param package_root: where a package set (:class:`PackageSet`) goes in the image, a directory the runtime
        searches by itself; ``None`` when the profile vendors no packages.
    """

    tag: str
    labels: Mapping[str, str]
    helper_digests: Mapping[str, str]
    runtime_path: str
    runtime_version_label: str
    runtime_version_argv: Sequence[str]
    forbidden_names: frozenset[str] = frozenset()
    package_root: str | None = None


@dataclass(frozen=True)
class PackageSet:
    """Third-party packages vendored into the image, read-only, under :attr:`ImageSpec.package_root`.

    A profile makes it from an operator's manifest (:meth:`Profile.package_set`) after checking every package;
    core writes the tree (root-owned, files 0444, directories 0555), labels the image with the list and a digest
    of list and tree (:mod:`code_sandbox.image.package_sets`), and ``verify-image`` checks the tree on disk against it.

    :param packages: what user code can import by name, as ``name@version``, sorted.
    :param files: path relative to the package root -> content; directories follow from the paths.
    """

    packages: tuple[str, ...]
    files: Mapping[str, bytes]


@dataclass(frozen=True)
class ImageContents:
    """What an offline image build puts in the image besides the users, groups and mount points core adds.

    :param runtime_source: the runtime binary on the build host (a Linux ELF executable); it is installed
        root-owned and unreadable (mode 0711), which makes every process that runs it non-dumpable.
    :param runtime_path: where the binary goes in the image.
    :param runtime_version: the runtime's version, e.g. ``v22.20.0``; becomes the runtime version label.
    :param files: in-image path -> content (bytes) or host file (a path) for the helpers and any tree the runtime
        needs (a standard library, say); all root-owned and read-only. Core adds the shared libraries that the
        binary and any ELF file among these need.
    :param runtime_sha256: the digest the binary must have when it comes from a pinned source, else ``None``.
    :param reinstall_hint: how to fix a pinned binary whose digest does not match.
    """

    runtime_source: Path
    runtime_path: str
    runtime_version: str
    files: Mapping[str, bytes | Path] = field(default_factory=dict[str, bytes | Path])
    runtime_sha256: str | None = None
    reinstall_hint: str = "reinstall the profile package"


class Profile(abc.ABC):
    """A runtime profile. Subclass it, fill in :attr:`info`, implement the methods, and register an instance.

    Every method is called by core with validated input and must return quickly without touching Docker.
    """

    info: ProfileInfo

    @property
    def name(self) -> str:
        return self.info.name

    @abc.abstractmethod
    def image_spec(self) -> ImageSpec:
        """The image this profile runs in: its tag, labels and the digests of its helpers."""

    @abc.abstractmethod
    def image_contents(self, runtime: Path | None) -> ImageContents:
        """What the offline image build needs.

        :param runtime: an operator-supplied runtime binary (``build-image --runtime``), or ``None`` for the
            profile's own pinned or discovered one.
        """

    @abc.abstractmethod
    def build_run_argv(self, entrypoint: str, arguments: Sequence[str]) -> list[str]:
        """The exact argv that runs an entrypoint in the sandbox (cwd ``/workspace``); no shell is ever involved.

        :param entrypoint: a validated workspace-relative path with an allowed suffix.
        :param arguments: validated program arguments, passed through as separate argv entries.
        """

    @abc.abstractmethod
    def helper_argv(self, helper: HelperKind) -> list[str]:
        """The argv prefix that starts one of the in-container helpers; core appends the helper's arguments."""

    def package_set(self, manifest: Path, *, sources: Path | None, progress: Callable[[str], None]) -> PackageSet:
        """Vendor the packages ``manifest`` lists (``build-image --packages``), each checked before use.

        :param manifest: the operator's list of pinned packages, in the format the profile documents.
        :param sources: a directory to take the packages from instead of their recorded sources, or ``None``.
        :param progress: call it with a short line of what is being done.
        :return: the checked set. Raise :class:`~code_sandbox.errors.SandboxError` (``IMAGE_BUILD_FAILED``, naming
            the package) for anything refused. The default vendors nothing: the profile has no package sets.
        """
        del manifest, sources, progress
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            f"the {self.name} profile has no package sets",
            hint="build without --packages",
        )

    def describe_packages(self, packages: Sequence[str]) -> str:
        """One sentence for the run tools' descriptions (their ``{packages}`` placeholder): the packages a
        program can import, or that there are none. Core shortens a long list before it calls this."""
        if not packages:
            return "none beyond the runtime's standard library; nothing can be installed"
        return "these, read-only, besides the standard library (nothing else can be installed): " + ", ".join(packages)

    @abc.abstractmethod
    def probe_argv(self) -> list[str]:
        """An argv that prints one :class:`code_sandbox.channel.protocol.ProbeAnswer` line: what the kernel enforces,
        seen from inside a hardened container (``code-sandbox doctor`` runs it as an unprivileged uid)."""


def read_helpers(package: str, names: Iterable[str], *, missing: str, hint: str) -> dict[str, bytes]:
    """A profile's in-container helpers from its package data (:mod:`importlib.resources`, so an installed wheel
    works outside a checkout), by file name.

    :param missing: what is missing, for the error (e.g. "the in-container helpers are missing from ...").
    :param hint: how to reinstall the package.
    :raises SandboxError: ``PROFILE_ERROR`` when one cannot be read.
    """
    try:
        sources = resources.files(package)
        return {name: sources.joinpath(name).read_bytes() for name in names}
    except (OSError, ModuleNotFoundError):
        raise SandboxError(ErrorCode.PROFILE_ERROR, missing, hint=hint) from None


def helper_digests(directory: str, sources: Mapping[str, bytes]) -> dict[str, str]:
    """In-image helper path (``directory``/name) -> the sha256 of its source: what ``verify-image`` expects."""
    return {f"{directory}/{name}": hashlib.sha256(data).hexdigest() for name, data in sources.items()}


@dataclass(frozen=True)
class HelperFiles:
    """A profile's in-container helpers: the package whose data holds their sources, the image directory they are
    copied to, and each helper's file name there; read once, on first use.

    :param missing: what is missing, for the error when a source cannot be read (:func:`read_helpers`).
    :param hint: how to reinstall the package.
    """

    package: str
    directory: str
    names: Mapping[HelperKind, str]
    missing: str
    hint: str
    modules: tuple[str, ...] = ()
    """Files the helpers load or start besides themselves, shipped, copied and verified with them."""

    @functools.cached_property
    def sources(self) -> Mapping[str, bytes]:
        """Each helper's (and module's) source, by file name."""
        names = [*self.names.values(), *self.modules]
        return read_helpers(self.package, names, missing=self.missing, hint=self.hint)

    def path(self, helper: HelperKind) -> str:
        """Where ``helper`` is in the image."""
        return f"{self.directory}/{self.names[helper]}"

    def image_files(self) -> dict[str, bytes]:
        """In-image path -> source, for :attr:`ImageContents.files`."""
        return {f"{self.directory}/{name}": data for name, data in self.sources.items()}

    def digests(self) -> dict[str, str]:
        """In-image path -> sha256 of the source, for :attr:`ImageSpec.helper_digests`."""
        return helper_digests(self.directory, self.sources)

    def labels(self, prefix: str) -> dict[str, str]:
        """``<prefix>helper.<kind>.sha256`` -> each helper's sha256, for :attr:`ImageSpec.labels`."""
        digests = self.digests()
        return {f"{prefix}helper.{kind}.sha256": digests[self.path(kind)] for kind in self.names}
