"""Stable error codes and the one exception type that carries them to users.

Every failure a user can see is a :class:`SandboxError`: a code from :class:`ErrorCode` and a message written
by us. Messages never carry submitted input, host paths, Docker text, container IDs or tracebacks, so they are
always safe to show to a client, a terminal or a log. What the engine itself said, when it refused, travels beside
the message as :attr:`SandboxError.engine_text`, bounded and escaped, for the operator's surfaces only (the CLI,
``doctor``, stderr logs); an MCP client never sees it.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.StrEnum):
    """Stable, documented error codes. Never rename one: clients match on them."""

    INVALID_REQUEST = "INVALID_REQUEST"
    INVALID_SESSION = "INVALID_SESSION"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    SESSION_LIMIT_EXCEEDED = "SESSION_LIMIT_EXCEEDED"
    SERVER_BUSY = "SERVER_BUSY"
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
    NOT_SUPPORTED = "NOT_SUPPORTED"
    SNAPSHOT_NOT_FOUND = "SNAPSHOT_NOT_FOUND"
    SNAPSHOT_EXISTS = "SNAPSHOT_EXISTS"
    SNAPSHOT_LIMIT_EXCEEDED = "SNAPSHOT_LIMIT_EXCEEDED"
    SNAPSHOT_INVALID = "SNAPSHOT_INVALID"
    INTERNAL_ERROR = "INTERNAL_ERROR"


class SandboxError(Exception):
    """A failure with a stable code and a message that is safe to show anywhere.

    :param code: the stable code clients match on.
    :param message: a sentence written by us; never include user input or Docker/host details in it.
    :param hint: an optional one-line fix for an operator (CLI output only).
    :param engine_text: what the engine said when it refused, for an operator (never for a client); it is kept as
        :func:`engine_words` makes it.
    """

    def __init__(
        self, code: ErrorCode, message: str, *, hint: str | None = None, engine_text: str | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.hint = hint
        self.engine_text = engine_words(engine_text) if engine_text and engine_text.strip() else None
        """The engine's own words, one bounded line with every control character escaped; ``None`` when it said
        nothing. Shown on the operator's surfaces only: it may hold host paths, container IDs or names."""

    def for_operator(self) -> str:
        """The message with the engine's own words after it, for a terminal or a log (never for a client)."""
        if self.engine_text is None:
            return self.message
        return f"{self.message}; the engine said: {self.engine_text}"

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def escape_unprintable(text: str) -> str:
    """``text`` with every character a terminal would act on (control characters, escape sequences, line breaks,
    bidi and zero-width characters, lone surrogates) shown as its escape (``\\x1b``, ``\\n``, ``\\u202e``)."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


ENGINE_TEXT_LIMIT = 400
"""Characters of the engine's words kept for an operator: enough for an OCI runtime's complaint, not a log dump."""


def engine_words(text: str, limit: int = ENGINE_TEXT_LIMIT) -> str:
    """An engine's message made safe for one line of a terminal: :func:`quoted`, without its surrounding blanks."""
    return quoted(text.strip(), limit)


def quoted(text: str, limit: int) -> str:
    """``text`` quoted and made safe for one line of a terminal: every character that is not printable (control
    characters, escape sequences, line breaks, bidi and zero-width characters) is shown as its escape (``\\x1b``,
    ``\\n``, ``\\u202e``) and a backslash or quote gets one before it, so nothing it says can move the cursor or
    hide text; past ``limit`` characters it is cut, and ``...`` shows the cut."""
    escaped: list[str] = []
    size = 0
    for char in text:
        shown = "\\" + char if char in '\\"' else escape_unprintable(char)
        if size + len(shown) > limit:
            return '"' + "".join(escaped) + '..."'
        escaped.append(shown)
        size += len(shown)
    return '"' + "".join(escaped) + '"'
