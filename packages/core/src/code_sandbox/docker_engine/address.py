"""Where the engine is and how to reach it, worked out as the docker CLI does, and whether anyone on the way could
pose as it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import docker.errors
from docker.context import ContextAPI
from docker.context.config import get_current_context_name
from docker.tls import TLSConfig

from code_sandbox.settings import SettingsError

_TLS_FILES = ("ca.pem", "cert.pem", "key.pem")


@dataclass(frozen=True)
class EngineAddress:
    """Where the engine listens and how to reach it, worked out as the docker CLI does: ``DOCKER_HOST`` (with
    ``DOCKER_TLS_VERIFY`` and ``DOCKER_CERT_PATH``), else the Docker context in use (``DOCKER_CONTEXT``, else the
    CLI configuration's current context), else the local socket."""

    url: str | None
    """``unix://``, ``tcp://`` or ``npipe://``; ``None`` is the platform's default socket."""
    origin: str
    """Where the address came from, for ``doctor``: ``DOCKER_HOST``, ``Docker context NAME``, ``default``."""
    tls: TLSConfig | None = None
    tls_verify: bool = False
    """Whether the engine's certificate is checked against a CA (``DOCKER_TLS_VERIFY``)."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> EngineAddress:
        """:raises SettingsError: an address we cannot use, or a TLS set-up without its files; never the value."""
        env = os.environ if environ is None else environ
        host = env.get("DOCKER_HOST") or None
        if host is not None:
            _check_scheme("DOCKER_HOST", host)
            cert_path = env.get("DOCKER_CERT_PATH") or None
            verify = bool(env.get("DOCKER_TLS_VERIFY"))  # any non-empty value, as the docker CLI reads it
            if not (verify or cert_path):
                return cls(host, "DOCKER_HOST")
            directory = cert_path or os.path.join(os.path.expanduser("~"), ".docker")
            missing = [name for name in _TLS_FILES if not os.path.isfile(os.path.join(directory, name))]
            if missing:
                raise SettingsError(
                    "DOCKER_CERT_PATH", f"must be a directory holding ca.pem, cert.pem and key.pem (missing: "
                    f"{', '.join(missing)})"
                )  # fmt: skip
            ca, cert, key = (os.path.join(directory, name) for name in _TLS_FILES)
            tls = TLSConfig(client_cert=(cert, key), ca_cert=ca, verify=verify)
            return cls(host, "DOCKER_HOST", tls, verify)
        variable = "DOCKER_CONTEXT" if env.get("DOCKER_CONTEXT") else "the current Docker context"
        name = env.get("DOCKER_CONTEXT") or get_current_context_name()
        if name == "default":
            return cls(None, "default")
        try:
            context = ContextAPI.get_context(name)
        except docker.errors.DockerException:
            context = None
        if context is None or not context.Host:
            raise SettingsError(variable, "names a Docker context that does not exist (see `docker context ls`)")
        _check_scheme(variable, context.Host)
        endpoint = context.endpoints.get("docker") or {}
        tls, verify = _context_tls(str(context.tls_path or ""), bool(endpoint.get("SkipTLSVerify")))
        return cls(str(context.Host), f"Docker context {printable(name, 64)}", tls, verify)

    def require_checked(self) -> None:
        """:raises SettingsError: anyone on the way could pose as the engine (plain TCP, or TLS that does not check
        the engine's certificate); whoever answers as the engine would see every sandbox's files and output."""
        if self.checked:
            return
        variable = "DOCKER_HOST" if self.origin == "DOCKER_HOST" else "the current Docker context"
        if self.plain_http and self.tls is not None:
            raise SettingsError(variable, HTTP_IGNORES_TLS + " (use tcp:// or https://)")
        raise SettingsError(
            variable,
            "reaches the engine without TLS that checks its certificate (set DOCKER_TLS_VERIFY=1 and "
            "DOCKER_CERT_PATH, or use ssh://; `code-sandbox doctor` explains)",
        )

    @property
    def checked(self) -> bool:
        """Whether nobody between here and the engine can pose as it: a local socket, ssh (host keys), or TLS that
        checks the engine's certificate."""
        return self.local or self.ssh or (self.tls is not None and self.tls_verify and not self.plain_http)

    @property
    def plain_http(self) -> bool:
        """Whether the address is ``http://``, which the docker SDK always reaches in plain text: it takes the scheme
        as the word on TLS and drops the TLS settings (only ``tcp://`` follows them, and ``https://`` always uses
        TLS)."""
        return (self.url or "").lower().startswith("http://")

    @property
    def ssh(self) -> bool:
        """Whether the engine is reached over ssh (``docker system dial-stdio`` on its host)."""
        return (self.url or "").startswith("ssh://")

    @property
    def local(self) -> bool:
        """Whether the engine is reached through a socket of this machine (its files are this machine's)."""
        return self.url is None or self.url.startswith(("unix://", "npipe://"))

    def described(self) -> str:
        """The address shown, and where it came from unless it is the default: ``tcp://host:2376 (DOCKER_HOST)``."""
        return self.shown() if self.origin == "default" else f"{self.shown()} ({self.origin})"

    def shown(self) -> str:
        """The address without user, password, query or fragment: safe to print and to log."""
        if self.url is None:
            return "the default socket"
        parts = urlsplit(self.url)
        location = parts.hostname or ""
        if parts.port is not None:
            location += f":{parts.port}"
        return f"{parts.scheme}://{location}{parts.path}"


HTTP_IGNORES_TLS = "is an http:// address, which is reached in plain text whatever the TLS settings say"


def _check_scheme(variable: str, address: str) -> None:
    scheme = address.partition("://")[0].lower() if "://" in address else ""
    if scheme not in ("unix", "tcp", "ssh", "npipe", "http", "https"):
        raise SettingsError(variable, "must be a unix://, tcp://, ssh:// or npipe:// address")
    if scheme in ("tcp", "ssh", "http", "https"):
        try:
            urlsplit(address).port  # noqa: B018 - it raises for a port out of range or a broken host
        except ValueError:
            raise SettingsError(variable, "must be a unix://, tcp://, ssh:// or npipe:// address") from None


def _context_tls(directory: str, skip_verify: bool) -> tuple[TLSConfig | None, bool]:
    """A context's TLS from whatever files it keeps (``docker context create --docker ca=...,cert=...,key=...``):
    a CA alone still means the engine's certificate is checked, as the docker CLI does. No files: no TLS."""
    endpoint = os.path.join(directory, "docker")
    names = sorted(os.listdir(endpoint)) if directory and os.path.isdir(endpoint) else []
    # The docker CLI keeps ca.pem, cert.pem and key.pem; the SDK keeps the files' own names: found by prefix.
    present = {kind: os.path.join(endpoint, name) for kind in ("ca", "cert", "key") for name in names
               if name.startswith(kind)}  # fmt: skip
    if not present:
        return None, False
    client = (present["cert"], present["key"]) if {"cert", "key"} <= present.keys() else None
    verify = not skip_verify and "ca" in present
    return TLSConfig(client_cert=client, ca_cert=present.get("ca"), verify=verify), verify


def printable(text: str, limit: int = 80) -> str:
    """Engine text for ``doctor``'s table: printable ASCII only, and short."""
    return "".join(ch for ch in text if " " <= ch <= "~")[:limit]
