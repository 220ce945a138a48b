"""The docker SDK's client, made and reached where its public API falls short. Every use of a private attribute of
the SDK is in this module, each with the reason; nothing else in the package touches one.

The SDK's type stubs leave most of its answers untyped, so the client is held as :data:`Client` (``Any``) and every
answer it gives is validated by a model of :mod:`code_sandbox.docker_engine.answers` before it is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import docker
import docker.constants

from code_sandbox.docker_engine.address import EngineAddress
from code_sandbox.docker_engine.answers import VersionAnswer

Client = Any
"""A ``docker.APIClient``; see the module's docstring for why it is not typed as one."""


def connect(address: EngineAddress, timeout: int) -> tuple[Client, VersionAnswer]:
    """A client for the engine at ``address`` that reads nothing of requests' environment, speaking the API version
    the engine speaks, and the engine's answer to ``/version``.

    :raises: whatever the SDK or its transport raises (the caller translates it).
    """
    # A version is given so that the client does not ask the engine before trust_env is off.
    api: Client = docker.APIClient(
        base_url=address.url,
        tls=address.tls or False,
        timeout=timeout,
        version=docker.constants.MINIMUM_DOCKER_API_VERSION,
    )
    # The engine is trusted through DOCKER_CERT_PATH alone: requests' environment is not read (REQUESTS_CA_BUNDLE
    # would replace the engine's CA; a proxy or .netrc would see its traffic).
    api.trust_env = False
    version = VersionAnswer.model_validate(api.version(api_version=False))
    # Private: the SDK finds the version itself only with version="auto", which asks the engine while requests'
    # environment is still trusted; this sets what "auto" would have found.
    api._version = version.ApiVersion
    return api, version


def get_json(api: Client, path: str, *arguments: str) -> object:
    """``GET`` an engine endpoint the SDK has no call for (Podman's own ``/libpod/...``), its JSON answer unread.
    ``path`` is a format with ``{0}``... for ``arguments``, which are quoted; a path starting ``/v`` is versioned
    by the caller."""
    # Private: the SDK's request helpers are the only way to reach an endpoint with its base URL, TLS and transport
    # (unix socket, ssh) without a second HTTP client.
    url = f"{api.base_url}{path}" if path.startswith("/v") else api._url(path, *arguments)
    return api._result(api._get(url), json=True)


class RawStream(Protocol):
    """What an exec's attach stream is underneath: a socket (unix, TCP, TLS, ssh) or a Windows named pipe."""

    def send(self, data: memoryview, /) -> int: ...
    def recv(self, size: int, /) -> bytes: ...
    def settimeout(self, value: float | None, /) -> None: ...
    def shutdown(self, how: int, /) -> None: ...
    def close(self) -> None: ...


def attach_socket(attached: Client) -> RawStream:
    """The socket under an exec's attach stream: ``exec_start(socket=True)`` returns the SDK's ``SocketIO`` (or a
    transport's own stream), whose raw socket is needed for timeouts and to half-close stdin."""
    # Private: SocketIO keeps it in _sock and has no public accessor; other transports return the socket itself.
    raw: RawStream = getattr(attached, "_sock", attached)
    return raw


def stream_parts(attached: object, raw: RawStream) -> Iterable[object]:
    """Everything that holds an exec's attach stream open: ``SocketIO.close()`` leaves the socket it wraps open, and
    over TLS the SDK hangs the HTTP response on the socket, whose file object holds it open until it closes."""
    # Private: the response is kept on the socket as _response, with no public way to reach it.
    return (attached, raw, getattr(raw, "_response", None))
