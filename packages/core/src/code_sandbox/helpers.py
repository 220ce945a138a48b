"""Calling the in-container helpers: one exec, one JSON answer, fail closed on anything unexpected.

Helpers answer with exactly one JSON line on stdout and exit 0 (also for refusals). Any other outcome (a crash,
no answer, an out-of-protocol answer, a broken stream) means the sandbox can no longer be trusted.
"""

from __future__ import annotations

import itertools
import json
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from code_sandbox.engine import DockerEngine
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import SANDBOX_USER

MiB = 1024 * 1024


class HelperCrash(SandboxError):
    """The helper did not answer within its protocol; the caller must destroy the session."""

    def __init__(self, message: str = "the sandbox helper failed") -> None:
        super().__init__(ErrorCode.INTERNAL_ERROR, message)


def request_frame(request: Mapping[str, Any]) -> bytes:
    """A helper request as one stdin frame: a 4-byte big-endian length, then UTF-8 JSON.

    Requests go over stdin, not argv, because the kernel caps one argv string at 128 KiB, which 32 arguments
    of 4 KiB (or 100 long paths) exceed once written as JSON.
    """
    body = json.dumps(request, ensure_ascii=False).encode()
    return struct.pack(">I", len(body)) + body


def call_helper(
    engine: DockerEngine,
    container_id: str,
    argv: list[str],
    *,
    request: Mapping[str, Any] | None = None,
    stdin: Iterable[bytes] | None = None,
    timeout: float,
    max_answer: int = 16 * MiB,
    max_stderr: int = MiB,
    on_stderr: Callable[[bytes], None] | None = None,
) -> dict[str, Any]:
    """Run one helper exec as the sandbox user and return its parsed answer.

    :raises HelperCrash: the helper crashed, answered out of protocol, or the stream broke.
    :raises SandboxError: ``TIMEOUT`` or ``CONTAINER_UNAVAILABLE`` from the engine.
    """
    if request is not None:
        argv = [*argv, "-"]
        stdin = itertools.chain([request_frame(request)], stdin or ())
    try:
        result = engine.exec(
            container_id,
            argv,
            user=SANDBOX_USER,
            stdin=stdin,
            timeout=timeout,
            max_stdout=max_answer,
            max_stderr=max_stderr,
            on_stderr=on_stderr,
            # The answer alone decides: a helper exits 0 right after its one line, and a crash cannot produce a
            # valid line. Skipping exec_inspect saves a Docker round trip on every call.
            exit_code=False,
        )
    except SandboxError as error:
        if error.code == ErrorCode.TRANSFER_FAILED:
            raise HelperCrash("the transfer to the sandbox broke off") from None
        raise
    lines = result.stdout.splitlines()
    if len(lines) != 1 or not result.stdout.endswith(b"\n"):
        raise HelperCrash()
    try:
        answer = json.loads(lines[0])
    except ValueError:
        raise HelperCrash() from None
    if not isinstance(answer, dict) or not isinstance(cast(dict[str, Any], answer).get("ok"), bool):
        raise HelperCrash()
    return cast(dict[str, Any], answer)
