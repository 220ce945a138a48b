"""Every Docker SDK or transport failure becomes a :class:`SandboxError` in our words here; what the engine said goes
only into its ``engine_text``, for the operator."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Generator

import docker.errors
import paramiko
import pydantic
import requests.exceptions

from code_sandbox.errors import ErrorCode, SandboxError

logger = logging.getLogger(__name__)

TRANSPORT_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    ConnectionError,
    socket.timeout,
    paramiko.SSHException,  # ssh:// engines
)
APIError = docker.errors.APIError
NotFound = docker.errors.NotFound


def unavailable() -> SandboxError:
    return SandboxError(
        ErrorCode.CONTAINER_UNAVAILABLE,
        "the Docker engine is not reachable",
        hint="start Docker (Linux containers) and check that `docker info` works for this user",
    )


def connection_failed(exc: BaseException) -> SandboxError:
    """The error for a client that could not be made: ssh and TLS failures name their fix."""
    if isinstance(exc, paramiko.SSHException):
        return SandboxError(
            ErrorCode.CONTAINER_UNAVAILABLE,
            "the ssh connection to the Docker engine's host failed",
            hint="the host must be in ~/.ssh/known_hosts and accept this user's key; "
            "`ssh HOST docker version` must work",
        )
    if isinstance(exc, requests.exceptions.SSLError):
        return SandboxError(
            ErrorCode.CONTAINER_UNAVAILABLE,
            "the TLS connection to the Docker engine failed",
            hint="DOCKER_CERT_PATH must hold the CA that signed the engine's certificate, and a client "
            "certificate the engine accepts (run `code-sandbox doctor`)",
        )
    return unavailable()


CONNECT_ERRORS = (
    docker.errors.DockerException,
    requests.exceptions.RequestException,
    pydantic.ValidationError,
    *TRANSPORT_ERRORS,
)
"""What making a client and asking the engine's version can raise: each is :func:`connection_failed`."""


@contextlib.contextmanager
def translate(code: ErrorCode, message: str) -> Generator[None]:
    """Turn any SDK or transport failure, or an answer of a shape we do not know, into our error; the original goes
    to the debug log by type only."""
    try:
        yield
    except SandboxError:
        raise
    except TRANSPORT_ERRORS as exc:
        logger.debug("docker transport failure: %s", type(exc).__name__)
        raise unavailable() from None
    except pydantic.ValidationError:
        logger.debug("the engine answered in a shape this adapter does not know")
        raise SandboxError(code, message) from None
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        logger.debug("docker call failed: %s", type(exc).__name__)
        if isinstance(exc, docker.errors.DockerException) and not isinstance(exc, APIError):
            raise unavailable() from None
        raise SandboxError(code, message, engine_text=engine_text(exc)) from None


def engine_text(exc: BaseException) -> str | None:
    """What the engine said when it refused (an API error's explanation), for the operator; ``None`` for a failure on
    this side of the wire, whose text is ours or the OS's, not the engine's."""
    if not isinstance(exc, APIError):
        return None
    explanation = exc.explanation
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or f"HTTP {exc.status_code}")


def said(exc: APIError) -> str:
    """The engine's explanation, for matching the words that tell one refusal from another."""
    return str(exc.explanation or "")


def container_gone() -> SandboxError:
    return SandboxError(ErrorCode.CONTAINER_UNAVAILABLE, "the sandbox container is gone")
