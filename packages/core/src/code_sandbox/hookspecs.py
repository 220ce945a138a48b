"""The hook specifications a runtime profile implements, and the value types they exchange.

A profile is a pluggy plugin registered under the entry-point group ``code_sandbox``. Core never imports a
profile: everything it knows about a runtime (its name, image, argv and helpers) comes through these hooks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pluggy

PROJECT = "code_sandbox"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

HelperKind = Literal["watchdog", "files", "runner"]
"""The three in-container helpers: the lifetime watchdog, the file helper and the runner."""


@dataclass(frozen=True)
class ProfileInfo:
    """Who a profile is and what its run tool looks like to a client.

    :param name: the profile's name, e.g. ``javascript-offline``; ``CODE_SANDBOX_PROFILE`` selects by it.
    :param run_tool_name: the MCP tool that runs an entrypoint, e.g. ``run_javascript``.
    :param run_tool_description: that tool's description, written for a model.
    :param language: the language's display name, e.g. ``JavaScript``.
    :param entrypoint_suffixes: the file suffixes an entrypoint may have, e.g. ``(".js", ".mjs", ".cjs")``.
    :param execute_tool_name: the one-shot MCP tool (fresh sandbox, write, run, destroy), e.g.
        ``execute_javascript``.
    """

    name: str
    run_tool_name: str
    run_tool_description: str
    language: str
    entrypoint_suffixes: tuple[str, ...]
    execute_tool_name: str


@dataclass(frozen=True)
class ImageSpec:
    """The single image a profile allows, and how to check it.

    :param tag: the one allowlisted tag; the server resolves it to an immutable ``sha256:`` ID and never pulls.
    :param labels: every label the image must carry, with its exact value.
    :param helper_digests: in-image path of each helper -> the sha256 hex digest its file must have.
    :param runtime_path: in-image path of the runtime binary.
    :param runtime_version_label: the label whose value must equal what ``runtime_version_argv`` prints.
    :param runtime_version_argv: argv that prints the runtime's version inside a hardened container.
    """

    tag: str
    labels: Mapping[str, str]
    helper_digests: Mapping[str, str]
    runtime_path: str
    runtime_version_label: str
    runtime_version_argv: Sequence[str]


@dataclass(frozen=True)
class ImageContents:
    """What an offline image build puts in the image besides the users, groups and mount points core adds.

    :param runtime_source: the runtime binary on the build host (a Linux ELF executable).
    :param runtime_path: where the binary goes in the image.
    :param runtime_version: the runtime's version, e.g. ``v22.20.0``; becomes the runtime version label.
    :param helpers: in-image path -> file content of each helper.
    :param runtime_sha256: the digest the binary must have when it comes from a pinned source, else ``None``.
    """

    runtime_source: Path
    runtime_path: str
    runtime_version: str
    helpers: Mapping[str, bytes] = field(default_factory=dict[str, bytes])
    runtime_sha256: str | None = None


@hookspec
def code_sandbox_profile_info() -> ProfileInfo:
    """Describe the profile a plugin provides. Every profile plugin implements it.

    :return: the profile's identity and run-tool metadata.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def code_sandbox_image_spec() -> ImageSpec | None:
    """Resolve the profile's image: the one allowlisted tag and the exact labels it must carry.

    :return: the image specification.
    """


@hookspec(firstresult=True)
def code_sandbox_build_run_argv(entrypoint: str, arguments: Sequence[str]) -> list[str] | None:
    """Build the exact argv that runs an entrypoint inside the sandbox. No shell is ever involved.

    :param entrypoint: a validated workspace-relative path with an allowed suffix.
    :param arguments: validated program arguments, passed through as separate argv entries.
    :return: the argv, a list of strings.
    """


@hookspec(firstresult=True)
def code_sandbox_helper_argv(helper: HelperKind) -> list[str] | None:
    """Give the argv prefix that starts one of the in-container helpers; core appends the helper's arguments.

    :param helper: which helper: ``watchdog``, ``files`` or ``runner``.
    :return: the argv prefix, e.g. ``["node", "/opt/sandbox/runner.mjs"]``.
    """


@hookspec(firstresult=True)
def code_sandbox_image_contents(runtime_binary: Path | None) -> ImageContents | None:
    """Collect what an offline image build needs from the profile.

    :param runtime_binary: an operator-supplied runtime binary, or ``None`` for the profile's pinned one.
    :return: the binary, its version and the helper files.
    """
