"""Stable error codes and the one exception type that carries them to users.

Every failure a user can see is a :class:`SandboxError`: a code from :class:`ErrorCode` and a message written
by us. Messages never carry submitted input, host paths, Docker text, container IDs or tracebacks, so they are
always safe to show to a client, a terminal or a log.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Stable, documented error codes. Never rename one: clients match on them."""

    INVALID_REQUEST = "INVALID_REQUEST"
    INVALID_SESSION = "INVALID_SESSION"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    SESSION_LIMIT_EXCEEDED = "SESSION_LIMIT_EXCEEDED"
    INVALID_PATH = "INVALID_PATH"
    PATH_TRAVERSAL = "PATH_TRAVERSAL"
    NOT_FOUND = "NOT_FOUND"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    FILE_TOO_LARGE = "FILE_TOO_LARGE"
    BINARY_FILE = "BINARY_FILE"
    WORKSPACE_LIMIT_EXCEEDED = "WORKSPACE_LIMIT_EXCEEDED"
    WORKSPACE_INTEGRITY = "WORKSPACE_INTEGRITY"
    TRANSFER_FAILED = "TRANSFER_FAILED"
    OUTPUT_LIMIT_EXCEEDED = "OUTPUT_LIMIT_EXCEEDED"
    TIMEOUT = "TIMEOUT"
    PROCESS_CLEANUP_FAILED = "PROCESS_CLEANUP_FAILED"
    SUPERVISOR_FAILED = "SUPERVISOR_FAILED"
    CONTAINER_START_FAILED = "CONTAINER_START_FAILED"
    CONTAINER_REMOVAL_FAILED = "CONTAINER_REMOVAL_FAILED"
    CONTAINER_UNAVAILABLE = "CONTAINER_UNAVAILABLE"
    IMAGE_INVALID = "IMAGE_INVALID"
    IMAGE_BUILD_FAILED = "IMAGE_BUILD_FAILED"
    PROFILE_ERROR = "PROFILE_ERROR"
    SETTINGS_INVALID = "SETTINGS_INVALID"
    INTERNAL_ERROR = "INTERNAL_ERROR"


class SandboxError(Exception):
    """A failure with a stable code and a message that is safe to show anywhere.

    :param code: the stable code clients match on.
    :param message: a sentence written by us; never include user input or Docker/host details in it.
    :param hint: an optional one-line fix for an operator (CLI output only).
    """

    def __init__(self, code: ErrorCode, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
