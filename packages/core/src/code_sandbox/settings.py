"""Operator settings, read from ``CODE_SANDBOX_*`` environment variables and validated once at start-up.

Settings are never MCP inputs: a model cannot change a limit. An invalid value stops the command before it does
anything, with one line naming the variable and its allowed range (never the value itself).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.limits import MAX_SESSIONS, WORKSPACE_BYTES, MiB

_PREFIX = "CODE_SANDBOX_"


@dataclass(frozen=True)
class _IntSetting:
    field: str
    minimum: int
    maximum: int
    default: int
    unit: str


_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_RUNTIME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TAG_RULE = "must be 1 to 63 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"


def is_runtime_name(name: str) -> bool:
    """Whether ``name`` can name a container runtime (``CODE_SANDBOX_RUNTIME``'s rule); only such a name is ever
    shown."""
    return _RUNTIME.fullmatch(name) is not None


def is_valid_tag(tag: str) -> bool:
    """Whether ``tag`` may label containers (``CODE_SANDBOX_TAG``, ``reap --tag``)."""
    return _TAG.fullmatch(tag) is not None


_INT_SETTINGS = (
    _IntSetting("max_lifetime", 30, 3600, 600, "seconds"),
    _IntSetting("idle_timeout", 10, 1800, 180, "seconds"),
    _IntSetting("max_sessions", 1, MAX_SESSIONS, 3, "sessions"),
    _IntSetting("default_timeout", 1, 120, 30, "seconds"),
    _IntSetting("max_timeout", 1, 300, 120, "seconds"),
    _IntSetting("warm_pool", 0, 20, 1, "containers"),
    _IntSetting("snapshot_max_mib", 1, WORKSPACE_BYTES // MiB, WORKSPACE_BYTES // MiB, "MiB"),
    _IntSetting("snapshots_max", 1, 10000, 50, "snapshots"),
    _IntSetting("snapshots_max_total_mib", 1, 999999, 1024, "MiB"),
    _IntSetting("snapshot_max_age_hours", 1, 8760, 168, "hours"),
)


_DEFAULTS = {spec.field: spec.default for spec in _INT_SETTINGS}


def env_name(field: str) -> str:
    """The environment variable behind a settings field, e.g. ``max_sessions`` -> ``CODE_SANDBOX_MAX_SESSIONS``."""
    return _PREFIX + field.upper()


@dataclass(frozen=True)
class Settings:
    """Validated operator settings. Build them with :func:`load_settings`."""

    # The defaults are the table's, so that Settings() and load_settings({}) agree.
    max_lifetime: int = _DEFAULTS["max_lifetime"]
    idle_timeout: int = _DEFAULTS["idle_timeout"]
    max_sessions: int = _DEFAULTS["max_sessions"]
    default_timeout: int = _DEFAULTS["default_timeout"]
    max_timeout: int = _DEFAULTS["max_timeout"]
    warm_pool: int = _DEFAULTS["warm_pool"]
    snapshot_max_mib: int = _DEFAULTS["snapshot_max_mib"]
    """The most one snapshot may hold (its files' bytes); at most the workspace's size."""
    snapshots_max: int = _DEFAULTS["snapshots_max"]
    """How many snapshots may be kept on the engine (of this server's tag, when it has one)."""
    snapshots_max_total_mib: int = _DEFAULTS["snapshots_max_total_mib"]
    """How many bytes those snapshots may hold together."""
    snapshot_max_age_hours: int = _DEFAULTS["snapshot_max_age_hours"]
    """A snapshot older than this is no longer listed or restored, and the start-up sweep and ``reap`` remove it."""
    audit_enabled: bool = True
    audit_log: Path | None = None
    profile: str | None = None
    tag: str | None = None
    """Labels every container this server makes, e.g. with the client's name (``io.code-sandbox.tag=<tag>``)."""
    runtime: str | None = None
    """The engine's container runtime for every container this server makes (``runsc`` for gVisor); ``None`` is the
    engine's default runtime (``runc`` on a stock Docker engine)."""

    def container_labels(self) -> dict[str, str]:
        """The labels this operator asked for on every container (:attr:`DockerEngine.labels`)."""
        return {LABEL_TAG: self.tag} if self.tag is not None else {}


class SettingsError(SandboxError):
    """A setting is invalid; ``variable`` names it."""

    def __init__(self, variable: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(ErrorCode.SETTINGS_INVALID, f"{variable} {message}", hint=hint)
        self.variable = variable


RUNTIME_RULE = "must be the name of a container runtime: 1 to 64 ASCII letters, digits, '.', '_' or '-'"


def unknown_runtime(available: Iterable[str]) -> SettingsError:
    """The error for a ``CODE_SANDBOX_RUNTIME`` that the engine has not registered; it names the ones it has."""
    names = ", ".join(sorted(filter(is_runtime_name, available))) or "none"
    return SettingsError(env_name("runtime"), f"must name a runtime the Docker engine has registered (it has: {names})")


def _parse_int(spec: _IntSetting, raw: str) -> int:
    # ASCII digits only: int() would also take "+5", " 5", "1_000" and non-ASCII digits such as "٣".
    if not raw or len(raw) > 6 or not all("0" <= ch <= "9" for ch in raw):
        raise SettingsError(env_name(spec.field), _range_text(spec))
    value = int(raw)
    if not spec.minimum <= value <= spec.maximum:
        raise SettingsError(env_name(spec.field), _range_text(spec))
    return value


def _range_text(spec: _IntSetting) -> str:
    return (
        f"must be a whole number of {spec.unit} from {spec.minimum} to {spec.maximum} "
        f"written in ASCII digits (default {spec.default})"
    )


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate every setting.

    :param environ: the environment to read; ``os.environ`` when omitted.
    :raises SettingsError: on the first invalid value or failed cross-check.
    """
    env = os.environ if environ is None else environ
    ints: dict[str, int] = {}
    for spec in _INT_SETTINGS:
        raw = env.get(env_name(spec.field))
        ints[spec.field] = spec.default if raw is None else _parse_int(spec, raw)

    audit_raw = env.get(env_name("audit_enabled"), "true")
    if audit_raw not in ("true", "false"):
        raise SettingsError(env_name("audit_enabled"), "must be exactly 'true' or 'false' (default true)")

    audit_log: Path | None = None
    audit_log_raw = env.get(env_name("audit_log"))
    if audit_log_raw is not None:
        if not audit_log_raw or "\x00" in audit_log_raw:
            raise SettingsError(env_name("audit_log"), "must be a non-empty file path")
        audit_log = Path(audit_log_raw).expanduser()

    profile = env.get(env_name("profile")) or None

    runtime = env.get(env_name("runtime")) or None
    if runtime is not None and not is_runtime_name(runtime):
        raise SettingsError(env_name("runtime"), RUNTIME_RULE)

    tag = env.get(env_name("tag"))
    if tag is not None and not is_valid_tag(tag):
        raise SettingsError(env_name("tag"), TAG_RULE)

    if ints["default_timeout"] > ints["max_timeout"]:
        raise SettingsError(env_name("default_timeout"), f"must not exceed {env_name('max_timeout')}")
    if ints["idle_timeout"] > ints["max_lifetime"]:
        raise SettingsError(env_name("idle_timeout"), f"must not exceed {env_name('max_lifetime')}")
    if ints["warm_pool"] > ints["max_sessions"]:
        raise SettingsError(env_name("warm_pool"), f"must not exceed {env_name('max_sessions')}")
    if ints["max_timeout"] >= ints["max_lifetime"]:
        raise SettingsError(env_name("max_timeout"), f"must be less than {env_name('max_lifetime')}")

    return Settings(
        **ints,
        audit_enabled=audit_raw == "true",
        audit_log=audit_log,
        profile=profile,
        tag=tag,
        runtime=runtime,
    )
